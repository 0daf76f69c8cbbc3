package vm

import (
	"errors"
	"fmt"
	"regexp"

	"libvirt.org/go/libvirtxml"
)

// VolumeDisk is a pod volume given to the guest as a virtio-blk disk: a
// host block device (a raw block PVC) or a disk image file on a
// filesystem volume (disk.img).
type VolumeDisk struct {
	Name     string // the volume's container path, for messages
	Path     string // host block device node or image file
	Block    bool   // Path is a block device (<disk type='block'>)
	Format   string // "raw" or "qcow2"; a block device is always raw
	Serial   string // stable name the guest sees, see MaxSerialLen
	ReadOnly bool
	// HostCache goes through the host page cache: for image files on a
	// filesystem without O_DIRECT (tmpfs), where cache=none cannot open.
	HostCache bool
}

// Share is a host directory given to the guest through virtiofs, under a
// tag the guest mounts (mount -t virtiofs <tag> <dir>).
type Share struct {
	Name   string // the volume's container path, for messages
	Source string // host directory virtiofsd serves
	Tag    string // see MaxTagLen
}

// Limits of the volume devices.
const (
	// MaxSerialLen is the longest serial virtio-blk passes to the guest
	// (VIRTIO_BLK_ID_BYTES).
	MaxSerialLen = 20
	// MaxTagLen is the longest virtiofs tag (the virtio-fs config's tag
	// field is 36 bytes).
	MaxTagLen = 36
	// MaxVolumeDisks is how many volume disks a VM takes: targets vdb to
	// vdy (vda is the root disk, vdz the config drive). Each disk and
	// share gets its own PCIe root port, which libvirt adds.
	MaxVolumeDisks = 24
	// MaxShares is how many virtiofs shares a VM takes (one virtiofsd
	// process each).
	MaxShares = 16
)

// serialRE is libvirt's pattern for a disk serial, without the space.
var serialRE = regexp.MustCompile(`^[A-Za-z0-9_.+-]+$`)

// validateVolumes reports the first volume the spec cannot render.
func (s *Spec) validateVolumes() error {
	if len(s.VolumeDisks) > MaxVolumeDisks {
		return fmt.Errorf("volume %s: %d disk volumes, more than the %d a VM has room for", s.VolumeDisks[MaxVolumeDisks].Name,
			len(s.VolumeDisks), MaxVolumeDisks)
	}
	if len(s.Shares) > MaxShares {
		return fmt.Errorf("volume %s: %d shared volumes, more than the %d a VM has room for", s.Shares[MaxShares].Name, len(s.Shares), MaxShares)
	}
	serials := map[string]bool{}
	for _, d := range s.VolumeDisks {
		switch {
		case d.Path == "":
			return fmt.Errorf("volume %s: no host path", d.Name)
		case d.Format != "raw" && (d.Block || d.Format != "qcow2"):
			return fmt.Errorf("volume %s: format %q", d.Name, d.Format)
		case len(d.Serial) > MaxSerialLen || !serialRE.MatchString(d.Serial):
			return fmt.Errorf("volume %s: serial %q is not 1 to %d of [A-Za-z0-9_.+-]", d.Name, d.Serial, MaxSerialLen)
		case serials[d.Serial]:
			return fmt.Errorf("volume %s: serial %q is used twice", d.Name, d.Serial)
		}
		serials[d.Serial] = true
	}
	tags := map[string]bool{}
	for _, sh := range s.Shares {
		switch {
		case sh.Source == "":
			return fmt.Errorf("volume %s: no host directory", sh.Name)
		case len(sh.Tag) > MaxTagLen || !serialRE.MatchString(sh.Tag):
			return fmt.Errorf("volume %s: tag %q is not 1 to %d of [A-Za-z0-9_.+-]", sh.Name, sh.Tag, MaxTagLen)
		case tags[sh.Tag]:
			return fmt.Errorf("volume %s: tag %q is used twice", sh.Name, sh.Tag)
		}
		tags[sh.Tag] = true
	}
	if len(s.Shares) > 0 && s.VirtiofsBinary == "" {
		return errors.New("virtiofsd path is empty")
	}
	return nil
}

// configureVolumeDisks attaches each volume disk as virtio-blk with the
// host page cache bypassed (cache=none, io=native: the guest's flushes
// reach the volume, as on a cloud disk) under its stable serial.
func configureVolumeDisks(s *Spec, d *libvirtxml.Domain) {
	for i, v := range s.VolumeDisks {
		drv := &libvirtxml.DomainDiskDriver{Name: "qemu", Type: v.Format, Cache: "none", IO: "native", Discard: "unmap"}
		if v.HostCache {
			drv.Cache, drv.IO = "writeback", "threads"
		}
		disk := libvirtxml.DomainDisk{
			Device: "disk",
			Driver: drv,
			Source: fileSource(v.Path),
			Target: &libvirtxml.DomainDiskTarget{Dev: "vd" + string(rune('b'+i)), Bus: "virtio"},
			Serial: v.Serial,
		}
		if v.Block {
			disk.Source = &libvirtxml.DomainDiskSource{Block: &libvirtxml.DomainDiskSourceBlock{Dev: v.Path}}
		}
		if v.ReadOnly {
			disk.ReadOnly = &libvirtxml.DomainDiskReadOnly{}
		}
		d.Devices.Disks = append(d.Devices.Disks, disk)
	}
}

// configureShares adds one virtiofs device per share, each served by its
// own virtiofsd that libvirt starts. virtiofs needs guest memory QEMU can
// share with virtiofsd: memfd (of huge pages when configurePinning chose
// them) with shared access. libvirt 9.0 refuses <readonly/> for virtiofs:
// a read-only share's Source is a read-only bind mount the caller made.
func configureShares(s *Spec, d *libvirtxml.Domain) {
	if len(s.Shares) == 0 {
		return
	}
	if d.MemoryBacking == nil {
		d.MemoryBacking = &libvirtxml.DomainMemoryBacking{}
	}
	d.MemoryBacking.MemorySource = &libvirtxml.DomainMemorySource{Type: "memfd"}
	d.MemoryBacking.MemoryAccess = &libvirtxml.DomainMemoryAccess{Mode: "shared"}
	for _, sh := range s.Shares {
		d.Devices.Filesystems = append(d.Devices.Filesystems, libvirtxml.DomainFilesystem{
			AccessMode: "passthrough",
			Driver:     &libvirtxml.DomainFilesystemDriver{Type: "virtiofs"},
			Binary:     &libvirtxml.DomainFilesystemBinary{Path: s.VirtiofsBinary},
			Source:     &libvirtxml.DomainFilesystemSource{Mount: &libvirtxml.DomainFilesystemSourceMount{Dir: sh.Source}},
			Target:     &libvirtxml.DomainFilesystemTarget{Dir: sh.Tag},
		})
	}
}
