package nodeinstall

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigLoadsInRealContainerd gives what the installer writes to the
// containerd binaries the tiers use (Debian's 1.6, and the 2.x that
// hack/setup-host.sh builds) and reads back their merged view: the kvm
// runtime is there and the operator's settings are kept.
func TestConfigLoadsInRealContainerd(t *testing.T) {
	for _, tc := range []struct {
		version, bin, config string
	}{
		{"containerd://1.6.20", "/usr/bin/containerd", configV2},
		{"containerd://2.2.1", "/usr/local/lib/kvm-shim/containerd-v2.2.1/bin/containerd", configV3},
	} {
		t.Run(tc.version, func(t *testing.T) {
			if _, err := os.Stat(tc.bin); err != nil {
				t.Skipf("no %s (hack/setup-host.sh installs it)", tc.bin)
			}
			r := newRig(t, tc.version)
			// Node paths in a temp dir with the host root at /: imports
			// name real paths that containerd follows.
			dir := t.TempDir()
			l := &r.in.Layout
			l.HostRoot = "/"
			l.Prefix, l.ShimConfig, l.StateDir = filepath.Join(dir, "usr"), filepath.Join(dir, "shim.toml"), filepath.Join(dir, "state")
			l.ContainerdConfig, l.DropinDir = filepath.Join(dir, "config.toml"), filepath.Join(dir, "conf.d")
			must(t, os.WriteFile(l.ContainerdConfig, []byte(tc.config), 0o644))
			if _, err := r.in.Install(context.Background()); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(tc.bin, "--config", l.ContainerdConfig, "config", "dump").CombinedOutput()
			if err != nil {
				t.Fatalf("containerd config dump: %v\n%s", err, out)
			}
			dump := strings.ReplaceAll(string(out), "'", `"`) // 2.x dumps single-quoted strings
			for _, want := range []string{`runtimes.kvm]`, `runtime_type = "io.containerd.kvm.v1"`, `runtimes.runc]`, `bin_dir = "/usr/lib/cni"`,
				`ConfigPath = "` + l.ShimConfig + `"`} {
				if !strings.Contains(dump, want) {
					t.Errorf("containerd's merged config lacks %s:\n%s", want, dump)
				}
			}
		})
	}
}
