package nodeinstall

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
)

// Names of what the installer puts on a node.
const (
	ShimName    = "containerd-shim-kvm-v1"
	WrapperName = "kvm-qemu-wrapper"
	// Label is the node label set once the shim passed its check; the
	// RuntimeClass kvm selects nodes on it.
	Label      = "kvm.containerd.io/runtime"
	LabelValue = "ready"
)

// Layout says where things are. Every path but Payload is a path on the
// node, taken below HostRoot.
type Layout struct {
	// HostRoot is where the node's root is mounted ("/host"); "/" runs
	// on the node itself.
	HostRoot string
	// Payload is the directory of the installer's image holding bin/
	// (the shim and the wrapper), config.toml (the default shim config)
	// and containerd/ (deploy/deb's containerd snippets).
	Payload string
	// Prefix is where the binaries go: Prefix/bin/containerd-shim-kvm-v1
	// (on containerd's PATH) and Prefix/libexec/containerd-shim-kvm-v1/.
	Prefix string
	// ShimConfig is the shim's config; written from the payload when
	// absent, an operator's own is kept.
	ShimConfig string
	// ContainerdConfig is containerd's config.toml; DropinDir the
	// directory containerd 2.x imports (conf.d).
	ContainerdConfig, DropinDir string
	// StateDir holds the installer's record of what it changed.
	StateDir string
}

// DefaultLayout is a node with containerd's and the shim's usual paths.
func DefaultLayout() Layout {
	return Layout{
		HostRoot:         "/host",
		Payload:          "/opt/" + ShimName,
		Prefix:           "/usr/local",
		ShimConfig:       "/etc/" + ShimName + "/config.toml",
		ContainerdConfig: "/etc/containerd/config.toml",
		DropinDir:        "/etc/containerd/conf.d",
		StateDir:         "/var/lib/" + ShimName + "-installer",
	}
}

// validate refuses relative paths and paths TOML strings cannot carry
// as they are.
func (l Layout) validate() error {
	for name, p := range map[string]string{
		"host root": l.HostRoot, "payload": l.Payload, "prefix": l.Prefix, "shim config": l.ShimConfig,
		"containerd config": l.ContainerdConfig, "drop-in dir": l.DropinDir, "state dir": l.StateDir,
	} {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p {
			return fmt.Errorf("%s %q must be a clean absolute path: %w", name, p, errdefs.ErrInvalidArgument)
		}
		if strings.ContainsAny(p, "\"\\\n\r\t") {
			return fmt.Errorf("%s %q holds a quote, backslash or control character: %w", name, p, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// host is path p of the node as the installer sees it.
func (l Layout) host(p string) string { return filepath.Join(l.HostRoot, p) }

// ShimPath is the shim's path on the node.
func (l Layout) ShimPath() string { return filepath.Join(l.Prefix, "bin", ShimName) }

// WrapperPath is the emulator wrapper's path on the node.
func (l Layout) WrapperPath() string {
	return filepath.Join(l.Prefix, "libexec", ShimName, WrapperName)
}

// DropinPath is the containerd 2.x drop-in's path on the node.
func (l Layout) DropinPath() string { return filepath.Join(l.DropinDir, ShimName+".toml") }

func (l Layout) recordPath() string { return l.host(filepath.Join(l.StateDir, "record.json")) }

func dirOf(p string) string { return filepath.Dir(p) }
