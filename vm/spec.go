package vm

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"unicode/utf8"
)

// Accel is the acceleration a domain runs with.
type Accel string

const (
	// AccelKVM runs the guest with hardware virtualization (domain type kvm).
	AccelKVM Accel = "kvm"
	// AccelTCG runs the guest under QEMU's software emulator (domain type qemu).
	AccelTCG Accel = "tcg"
)

// Spec is everything needed to render a domain. It is plain data: the
// caller has already resolved paths, sizes and acceleration.
type Spec struct {
	Name      string // libvirt domain name, see DomainName
	UUID      string // stable per VM, lower-case 8-4-4-4-12 hex
	VCPUs     int
	MemoryMiB int
	Accel     Accel
	Emulator  string // path of the QEMU binary (or its wrapper)
	Machine   string // e.g. "q35"

	// Exactly one boot source: a root disk, or a kernel for direct boot.
	Disk   *Disk
	Kernel *Kernel

	Console Console
	Meta    Metadata

	// ConfigDrive is attached read-only when set.
	ConfigDrive *ConfigDrive

	// Pinning places the VM on host CPUs and NUMA nodes; nil floats freely.
	Pinning *Pinning
	// HugePages backs guest memory with huge pages of this size; 0 is none.
	HugePageKiB uint64

	// MaxVCPUs is how many vCPUs the VM may grow to live (0: VCPUs).
	MaxVCPUs int
	// MaxMemoryMiB is how much memory the VM may grow to live (0:
	// MemoryMiB): a virtio-mem device holds the difference (memory.go).
	MaxMemoryMiB int
	// VolumeDisks and Shares are the pod's volumes (see volumes.go);
	// VirtiofsBinary is the virtiofsd libvirt starts for each share.
	VolumeDisks    []VolumeDisk
	Shares         []Share
	VirtiofsBinary string

	// Identity is the host uid and gid the VM's QEMU runs under; nil
	// leaves it to qemu.conf's user (shared by every such VM).
	Identity *Identity
}

// Pinning is where a VM's vCPUs, emulator threads and memory may run.
type Pinning struct {
	CPUSet       []int   // host CPUs every vCPU may float over (<vcpu cpuset>)
	VCPUPins     [][]int // host CPUs of vCPU i (<vcpupin>): one for a dedicated CPU, a node's for a guest NUMA cell
	EmulatorCPUs []int   // host CPUs of QEMU's emulator threads (<emulatorpin>)
	MemoryNodes  []int   // host nodes guest memory is bound to, strictly
	Cells        []Cell  // guest NUMA cells, when a VM spans host nodes
}

// Cell is one guest NUMA cell and the host node holding its memory.
type Cell struct {
	HostNode  int
	VCPUs     []int
	MemoryMiB int
}

// Disk is a disk image file attached as a virtio block device.
type Disk struct {
	Path   string // file QEMU opens (the overlay)
	Format string // "qcow2" or "raw"
}

// Kernel is a direct kernel boot: QEMU loads the kernel and initrd itself.
type Kernel struct {
	Path    string
	Initrd  string // optional
	Cmdline string
}

// ConfigDrive is an OpenStack config drive image: vfat goes in as a
// virtio disk, iso9660 as a CD-ROM on virtio-scsi (guests without AHCI
// drivers see no SATA CD-ROM).
type ConfigDrive struct {
	Path   string
	Format string // "vfat" or "iso9660"
}

// Console is the guest's first serial port: a unix socket QEMU listens on,
// and a log file virtlogd keeps whether or not anyone is connected.
type Console struct {
	Socket string
	Log    string
}

// Metadata is stored inside the domain so that a new shim can find and
// adopt a VM from libvirt alone.
type Metadata struct {
	SandboxID     string `xml:"sandbox-id,omitempty" json:"sandboxID,omitempty"`
	ContainerID   string `xml:"container-id" json:"containerID"`
	Namespace     string `xml:"namespace" json:"namespace"`
	PodUID        string `xml:"pod-uid,omitempty" json:"podUID,omitempty"`
	PodName       string `xml:"pod-name,omitempty" json:"podName,omitempty"`
	PodNamespace  string `xml:"pod-namespace,omitempty" json:"podNamespace,omitempty"`
	ContainerName string `xml:"container-name,omitempty" json:"containerName,omitempty"`
	StateDir      string `xml:"state-dir" json:"stateDir"`
	// NUMA is the VM's host placement as JSON, so a restarted shim can
	// rebuild the node's reservations from libvirt alone.
	NUMA string `xml:"numa,omitempty" json:"numa,omitempty"`
}

var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// Validate reports the first thing that makes the spec unrenderable.
func (s *Spec) Validate() error {
	switch {
	case s.Name == "":
		return errors.New("domain name is empty")
	case strings.Contains(s.Name, "\n"):
		// libvirt's schema and its parser refuse a newline in a name
		return fmt.Errorf("domain name %q has a newline", s.Name)
	case !uuidRE.MatchString(s.UUID):
		return fmt.Errorf("domain uuid %q is not a lower-case uuid", s.UUID)
	case s.VCPUs < 1:
		return fmt.Errorf("vcpus must be at least 1, got %d", s.VCPUs)
	case s.MemoryMiB < 1:
		return fmt.Errorf("memory must be at least 1 MiB, got %d", s.MemoryMiB)
	case s.Accel != AccelKVM && s.Accel != AccelTCG:
		return fmt.Errorf("unknown acceleration %q", s.Accel)
	case s.Identity != nil && (s.Identity.UID == 0 || s.Identity.GID == 0):
		return fmt.Errorf("identity %s would run QEMU as root", s.Identity.Label())
	case s.Emulator == "":
		return errors.New("emulator path is empty")
	case (s.Disk == nil) == (s.Kernel == nil):
		return errors.New("exactly one of disk and kernel must be set")
	case s.Disk != nil && s.Disk.Format != "qcow2" && s.Disk.Format != "raw":
		return fmt.Errorf("unknown disk format %q", s.Disk.Format)
	case s.Console.Socket == "" || s.Console.Log == "":
		return errors.New("console socket and log paths are required")
	case s.ConfigDrive != nil && s.ConfigDrive.Format != "vfat" && s.ConfigDrive.Format != "iso9660":
		return fmt.Errorf("unknown config drive format %q", s.ConfigDrive.Format)
	case s.MaxVCPUs != 0 && s.MaxVCPUs < s.VCPUs:
		return fmt.Errorf("max vcpus %d is below the %d vCPUs the VM starts with", s.MaxVCPUs, s.VCPUs)
	case s.MaxVCPUs > s.VCPUs && s.Pinning != nil && len(s.Pinning.VCPUPins) > 0:
		return fmt.Errorf("a VM with pinned vCPUs cannot add vCPUs live (max vcpus %d, %d pinned)", s.MaxVCPUs, s.VCPUs)
	case s.MaxMemoryMiB != 0 && s.MaxMemoryMiB < s.MemoryMiB:
		return fmt.Errorf("max memory %d MiB is below the %d MiB the VM starts with", s.MaxMemoryMiB, s.MemoryMiB)
	case HotplugMemoryMiB(s) > 0 && s.Pinning != nil && len(s.Pinning.Cells) > 1:
		return fmt.Errorf("a VM spread over %d guest NUMA cells cannot add memory live (max memory %d MiB)", len(s.Pinning.Cells), s.MaxMemoryMiB)
	case s.Pinning != nil && len(s.Pinning.VCPUPins) > 0 && len(s.Pinning.VCPUPins) != s.VCPUs:
		return fmt.Errorf("%d vCPU pins for %d vCPUs", len(s.Pinning.VCPUPins), s.VCPUs)
	}
	if err := s.validateText(); err != nil {
		return err
	}
	return s.validateVolumes()
}

// validateText refuses a string the domain XML cannot carry: invalid
// UTF-8 or a character outside XML 1.0's Char production (most control
// characters, U+FFFE, U+FFFF). encoding/xml would write U+FFFD in its
// place, so libvirt would get a different name or path than the spec's.
func (s *Spec) validateText() error {
	fields := map[string]string{
		"domain name": s.Name, "machine": s.Machine,
		"console socket path": s.Console.Socket, "console log path": s.Console.Log,
		"virtiofsd path":      s.VirtiofsBinary,
		"metadata sandbox-id": s.Meta.SandboxID, "metadata container-id": s.Meta.ContainerID,
		"metadata namespace": s.Meta.Namespace, "metadata pod-uid": s.Meta.PodUID,
		"metadata pod-name": s.Meta.PodName, "metadata pod-namespace": s.Meta.PodNamespace,
		"metadata container-name": s.Meta.ContainerName, "metadata state-dir": s.Meta.StateDir,
		"metadata numa": s.Meta.NUMA,
	}
	if s.Disk != nil {
		fields["disk path"] = s.Disk.Path
	}
	if s.Kernel != nil {
		fields["kernel path"], fields["initrd path"], fields["kernel command line"] = s.Kernel.Path, s.Kernel.Initrd, s.Kernel.Cmdline
	}
	if s.ConfigDrive != nil {
		fields["config drive path"] = s.ConfigDrive.Path
	}
	for _, d := range s.VolumeDisks {
		fields["volume "+d.Name+" path"], fields["volume name "+d.Name] = d.Path, d.Name
	}
	for _, sh := range s.Shares {
		fields["volume "+sh.Name+" source path"], fields["volume name "+sh.Name] = sh.Source, sh.Name
	}
	for what, v := range fields {
		if !xmlText(v) {
			return fmt.Errorf("%s %q has a character XML cannot carry", what, v)
		}
		// libvirt's schema takes only absolute paths below / for files
		// it opens (its absFilePath: "/" alone fails).
		if strings.HasSuffix(what, " path") && v != "" && (!filepath.IsAbs(v) || filepath.Clean(v) == "/") {
			return fmt.Errorf("%s %q is not an absolute path of a file", what, v)
		}
		// Its pattern "(/|[a-zA-Z]:\\).+" is an XML Schema regular
		// expression, whose "." takes neither a line feed nor a carriage
		// return.
		if strings.HasSuffix(what, " path") && strings.ContainsAny(v, "\r\n") {
			return fmt.Errorf("%s %q has a line break", what, v)
		}
	}
	return nil
}

// xmlText: v is valid UTF-8 of XML 1.0 Chars only.
func xmlText(v string) bool {
	if !utf8.ValidString(v) {
		return false
	}
	for _, r := range v {
		ok := r == '\t' || r == '\n' || r == '\r' || (r >= 0x20 && r <= 0xD7FF) ||
			(r >= 0xE000 && r <= 0xFFFD) || (r >= 0x10000 && r <= 0x10FFFF)
		if !ok {
			return false
		}
	}
	return true
}
