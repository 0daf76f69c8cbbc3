// Package config is the shim's TOML configuration: its keys, their
// defaults, and the checks that refuse a bad file before any task runs.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/pelletier/go-toml/v2"

	"github.com/kvm-shim/containerd-shim-kvm-v1/configdrive"
	"github.com/kvm-shim/containerd-shim-kvm-v1/hostid"
	"github.com/kvm-shim/containerd-shim-kvm-v1/numa"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// MinMemoryMiB is the least guest memory a VM may have.
const MinMemoryMiB = 64

// DefaultPath is read when the runtime options name no ConfigPath.
const DefaultPath = "/etc/containerd-shim-kvm-v1/config.toml"

// Config is the shim's TOML configuration. Every field has a default; see
// docs/configuration.md.
type Config struct {
	// LibvirtURI must be qemu:///system, the only driver supported.
	LibvirtURI string `toml:"libvirt_uri"`
	// LibvirtSocket is libvirtd's socket for that URI.
	LibvirtSocket string `toml:"libvirt_socket"`
	// Accel is "auto" (KVM when usable, else TCG with a warning), "kvm" or "tcg".
	Accel string `toml:"accel"`
	// StateDir keeps VM disks, consoles and per-pod data. It and its
	// parents must be searchable by the QEMU user.
	StateDir string `toml:"state_dir"`
	// QEMUBinary is the domain's <emulator>.
	QEMUBinary string `toml:"qemu_binary"`
	// QEMUWrapper is the <emulator> of VMs with a pod network: it receives
	// the TAP and vhost-net descriptors from the shim and execs QEMUBinary.
	QEMUWrapper string `toml:"qemu_wrapper"`
	// QEMUUser is the user libvirt runs QEMU as; only it may fetch a VM's
	// network descriptors.
	QEMUUser string `toml:"qemu_user"`
	// QEMUImg creates overlays and probes images.
	QEMUImg string `toml:"qemu_img"`
	// Virtiofsd serves each shared volume to its VM (libvirt starts one
	// per share; Debian's lives outside libvirt's default path).
	Virtiofsd string `toml:"virtiofsd"`
	// Machine is the QEMU machine type.
	Machine string `toml:"machine"`
	// DefaultVCPUs and DefaultMemoryMiB size a VM whose spec sets no limits.
	DefaultVCPUs     int `toml:"default_vcpus"`
	DefaultMemoryMiB int `toml:"default_memory_mib"`
	// MaxVCPUs and MaxMemoryMiB bound what a spec or annotation may ask.
	MaxVCPUs     int `toml:"max_vcpus"`
	MaxMemoryMiB int `toml:"max_memory_mib"`
	// HotplugMaxVCPUs is how many vCPUs a VM may grow to live (Update),
	// unless the max-vcpus annotation says otherwise; a VM that starts
	// with more keeps its own count. 0 adds no vCPUs live.
	HotplugMaxVCPUs int `toml:"hotplug_max_vcpus"`
	// HotplugMaxMemoryMiB is how much memory a VM may grow to live
	// (virtio-mem), unless the max-memory-mib annotation says otherwise.
	// 0 (the default) adds none: a VM gets no virtio-mem device.
	HotplugMaxMemoryMiB int `toml:"hotplug_max_memory_mib"`
	// MaxNetQueues caps the TAP queues (one per vCPU up to this).
	MaxNetQueues int `toml:"max_net_queues"`
	// VNetHdr opens the TAP with IFF_VNET_HDR so TSO and checksum offload
	// reach the guest. Only turn it off to measure what it is worth.
	VNetHdr bool `toml:"vnet_hdr"`
	// NUMAMode is the default placement: "node", "dedicated" or "none".
	NUMAMode string `toml:"numa_mode"`
	// CPUThreshold bounds floating vCPUs per host CPU of a node (CPU may
	// be overcommitted); MemThreshold bounds guest memory per node memory.
	CPUThreshold float64 `toml:"cpu_threshold"`
	MemThreshold float64 `toml:"mem_threshold"`
	// NUMAAllowSpread lets a VM larger than any node span the fewest nodes,
	// with a matching guest NUMA topology, instead of being refused.
	NUMAAllowSpread bool `toml:"numa_allow_spread"`
	// ReservedCPUs are host CPUs never given to VMs, e.g. "0-1".
	ReservedCPUs string `toml:"reserved_cpus"`
	// NUMAStateFile holds the node's reservations, shared by every shim of
	// the node; on a tmpfs (it is rebuilt from libvirt at each shim start).
	NUMAStateFile string `toml:"numa_state_file"`
	// ConfigDriveFormat is the default config drive: "vfat" (nova's
	// default, readable by Windows' cloudbase-init) or "iso9660".
	ConfigDriveFormat string `toml:"config_drive_format"`
	// AvailabilityZone goes into meta_data.json.
	AvailabilityZone string `toml:"availability_zone"`
	// KernelCmdline is used for direct kernel boot unless the pod sets
	// the kernel-cmdline annotation.
	KernelCmdline string `toml:"kernel_cmdline"`
	// VMIDRange is the host uids (and gids of the same numbers) given to
	// VMs, one each, "FIRST-LAST"; "" runs every VM as QEMUUser.
	VMIDRange string `toml:"vm_id_range"`
	// VMIDStateFile holds the node's identity allocations, shared by every
	// shim of the node; on a tmpfs (rebuilt from libvirt at each shim start).
	VMIDStateFile string `toml:"vm_id_state_file"`
	// PlainContainers runs every container without a VM image (no disk
	// under /disk/, no kernel under /boot/) with runc in the pod, and the
	// pod's sandbox as a real pause process with its own namespaces. Off:
	// such a container is refused, and the sandbox is the shim itself.
	PlainContainers bool `toml:"plain_containers"`
}

// Default returns the built-in defaults.
func Default() Config {
	return Config{
		LibvirtURI:        "qemu:///system",
		LibvirtSocket:     vm.DefaultSocket,
		Accel:             "auto",
		StateDir:          "/var/lib/containerd-shim-kvm-v1",
		QEMUBinary:        "/usr/bin/qemu-system-x86_64",
		QEMUWrapper:       "/usr/local/libexec/containerd-shim-kvm-v1/kvm-qemu-wrapper",
		QEMUUser:          "libvirt-qemu",
		QEMUImg:           "/usr/bin/qemu-img",
		Virtiofsd:         "/usr/lib/qemu/virtiofsd",
		Machine:           "q35",
		DefaultVCPUs:      1,
		DefaultMemoryMiB:  512,
		MaxVCPUs:          64,
		HotplugMaxVCPUs:   4,
		MaxMemoryMiB:      256 * 1024,
		MaxNetQueues:      4,
		VNetHdr:           true,
		NUMAMode:          "node",
		CPUThreshold:      4,
		MemThreshold:      1,
		NUMAStateFile:     "/run/containerd-shim-kvm-v1/numa.json",
		ConfigDriveFormat: "vfat",
		AvailabilityZone:  "nova",
		KernelCmdline:     "console=ttyS0",
		VMIDRange:         hostid.DefaultRange,
		VMIDStateFile:     "/run/containerd-shim-kvm-v1/ids.json",
	}
}

// Load reads the config at path over the defaults. A missing file at
// the default path means defaults; a missing file that was asked for, an
// unknown key or a bad value is an error naming the problem.
func Load(path string) (Config, error) {
	cfg := Default()
	explicit := path != ""
	if !explicit {
		path = DefaultPath
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) && !explicit {
		return cfg, nil
	}
	if err != nil {
		return Config{}, fmt.Errorf("read shim config: %w", err)
	}
	dec := toml.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		var strict *toml.StrictMissingError
		if errors.As(err, &strict) {
			var keys []string
			for _, e := range strict.Errors {
				keys = append(keys, strings.Join(e.Key(), "."))
			}
			err = fmt.Errorf("unknown keys: %s", strings.Join(keys, ", "))
		}
		return Config{}, fmt.Errorf("shim config %s: %v: %w", path, err, errdefs.ErrInvalidArgument)
	}
	if err := cfg.validate(); err != nil {
		return Config{}, fmt.Errorf("shim config %s: %v: %w", path, err, errdefs.ErrInvalidArgument)
	}
	return cfg, nil
}

func (c *Config) validate() error {
	switch {
	case c.LibvirtURI != "qemu:///system":
		return fmt.Errorf("libvirt_uri = %q: only qemu:///system is supported", c.LibvirtURI)
	case !filepath.IsAbs(c.StateDir):
		return fmt.Errorf("state_dir = %q: must be an absolute path", c.StateDir)
	case !filepath.IsAbs(c.QEMUBinary):
		return fmt.Errorf("qemu_binary = %q: must be an absolute path", c.QEMUBinary)
	case !filepath.IsAbs(c.VMIDStateFile):
		return fmt.Errorf("vm_id_state_file = %q: must be an absolute path", c.VMIDStateFile)
	case !filepath.IsAbs(c.NUMAStateFile):
		return fmt.Errorf("numa_state_file = %q: must be an absolute path", c.NUMAStateFile)
	case !filepath.IsAbs(c.QEMUWrapper):
		return fmt.Errorf("qemu_wrapper = %q: must be an absolute path", c.QEMUWrapper)
	case c.MaxNetQueues < 1 || c.MaxNetQueues > 16:
		return fmt.Errorf("max_net_queues = %d: must be between 1 and 16", c.MaxNetQueues)
	case !filepath.IsAbs(c.QEMUImg):
		return fmt.Errorf("qemu_img = %q: must be an absolute path", c.QEMUImg)
	case !filepath.IsAbs(c.Virtiofsd):
		return fmt.Errorf("virtiofsd = %q: must be an absolute path", c.Virtiofsd)
	case c.MaxVCPUs < 1:
		return fmt.Errorf("max_vcpus = %d: must be at least 1", c.MaxVCPUs)
	case c.MaxMemoryMiB < MinMemoryMiB:
		return fmt.Errorf("max_memory_mib = %d: must be at least %d", c.MaxMemoryMiB, MinMemoryMiB)
	case c.HotplugMaxVCPUs < 0 || c.HotplugMaxVCPUs > c.MaxVCPUs:
		return fmt.Errorf("hotplug_max_vcpus = %d: must be between 0 and max_vcpus (%d)", c.HotplugMaxVCPUs, c.MaxVCPUs)
	case c.HotplugMaxMemoryMiB < 0 || c.HotplugMaxMemoryMiB > c.MaxMemoryMiB:
		return fmt.Errorf("hotplug_max_memory_mib = %d: must be between 0 and max_memory_mib (%d)", c.HotplugMaxMemoryMiB, c.MaxMemoryMiB)
	case c.DefaultVCPUs < 1 || c.DefaultVCPUs > c.MaxVCPUs:
		return fmt.Errorf("default_vcpus = %d: must be between 1 and max_vcpus (%d)", c.DefaultVCPUs, c.MaxVCPUs)
	case c.DefaultMemoryMiB < MinMemoryMiB || c.DefaultMemoryMiB > c.MaxMemoryMiB:
		return fmt.Errorf("default_memory_mib = %d: must be between %d and max_memory_mib (%d)", c.DefaultMemoryMiB, MinMemoryMiB, c.MaxMemoryMiB)
	}
	if _, _, err := vm.ChooseAccel(c.Accel, vm.KVMInfo{Usable: true}); err != nil {
		return err
	}
	if _, err := configdrive.ParseFormat(c.ConfigDriveFormat); err != nil {
		return fmt.Errorf("config_drive_format: %v", err)
	}
	if c.VMIDRange != "" {
		if _, err := hostid.ParseRange(c.VMIDRange); err != nil {
			return fmt.Errorf("vm_id_range: %v", err)
		}
	}
	if _, err := numa.ParseMode(c.NUMAMode); err != nil {
		return fmt.Errorf("numa_mode: %v", err)
	}
	if _, err := c.NUMAPolicy(); err != nil {
		return err
	}
	return nil
}

// NUMAPolicy is the placement policy the config asks for.
func (c *Config) NUMAPolicy() (numa.Policy, error) {
	p := numa.Policy{CPUThreshold: c.CPUThreshold, MemThreshold: c.MemThreshold, AllowSpread: c.NUMAAllowSpread}
	if c.ReservedCPUs != "" {
		cpus, err := numa.ParseCPUList(c.ReservedCPUs)
		if err != nil {
			return p, fmt.Errorf("reserved_cpus = %q: %w", c.ReservedCPUs, err)
		}
		p.ReservedCPUs = cpus
	}
	return p, p.Validate()
}
