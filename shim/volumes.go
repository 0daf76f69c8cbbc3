package shim

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
	"github.com/kvm-shim/containerd-shim-kvm-v1/configdrive"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vmplan"
)

// classifyVolumes is vmplan.ClassifyVolumes with one info log line for
// the mounts the guest does not get.
func classifyVolumes(ctx context.Context, spec *specs.Spec) ([]vmplan.Volume, error) {
	vols, skipped, err := vmplan.ClassifyVolumes(spec)
	if err != nil {
		return nil, err
	}
	if len(skipped) > 0 {
		log.G(ctx).WithField("mounts", strings.Join(skipped, ", ")).Info("mounts not given to the VM")
	}
	return vols, nil
}

// guestVolumes is what the guest gets for the pod's volumes.
type guestVolumes struct {
	disks  []vm.VolumeDisk
	shares []vm.Share
	list   []configdrive.Volume // for the config drive
}

// prepareVolumes turns each volume into a disk or a share, checking it on
// the host. It creates the disk.img files the pod asked for, bind mounts
// of disk.img files under vmDir/volumes and read-only bind mounts of
// read-only shares under vmDir/shares; their undo goes to undo (a
// crashed shim's cleanup finds the mounts by readOnlyMounts). sizes are
// from annotations.DiskImages.
func prepareVolumes(ctx context.Context, h *host, vols []vmplan.Volume, sizes map[string]int64, vmDir string, id vm.Identity,
	undo *rollback) (guestVolumes, error) {
	var g guestVolumes
	diskNames, shareNames := vmplan.GuestNames(vols, vm.MaxSerialLen), vmplan.GuestNames(vols, vm.MaxTagLen)
	for p := range sizes {
		if !slices.ContainsFunc(vols, func(v vmplan.Volume) bool { return v.Kind == vmplan.VolBind && filepath.Clean(v.Dest) == p }) {
			return g, fmt.Errorf("annotation %s names %s, which is not a volume of the container: %w", annotations.DiskImages, p,
				errdefs.ErrInvalidArgument)
		}
	}
	for i, v := range vols {
		pin := filepath.Join(vmDir, volumesDir, diskNames[i]+".img")
		disk, share, err := prepareVolume(ctx, h, v, sizes[filepath.Clean(v.Dest)], pin, id, undo)
		if err != nil {
			return g, err
		}
		entry := log.G(ctx).WithField("volume", v.Dest).WithField("readOnly", v.ReadOnly)
		switch {
		case disk != nil:
			if len(g.disks) == vm.MaxVolumeDisks {
				return g, fmt.Errorf("volume %s: more than %d disk volumes (raw block or disk.img): %w", v.Dest, vm.MaxVolumeDisks,
					errdefs.ErrInvalidArgument)
			}
			disk.Name, disk.Serial, disk.ReadOnly = v.Dest, diskNames[i], v.ReadOnly
			g.disks = append(g.disks, *disk)
			g.list = append(g.list, configdrive.Volume{Kind: configdrive.VolumeDisk, Name: disk.Serial, Path: v.Dest, ReadOnly: v.ReadOnly})
			entry.WithField("path", disk.Path).WithField("source", v.Source).WithField("serial", disk.Serial).Info("volume is a virtio disk")
		default:
			if len(g.shares) == vm.MaxShares {
				return g, fmt.Errorf("volume %s: more than %d shared (virtiofs) volumes: %w", v.Dest, vm.MaxShares, errdefs.ErrInvalidArgument)
			}
			share.Name, share.Tag = v.Dest, shareNames[i]
			if v.ReadOnly {
				// libvirt 9.0 has no read-only virtiofs: virtiofsd serves a
				// read-only bind mount, so the guest cannot write whatever
				// it mounts.
				ro := filepath.Join(vmDir, sharesDir, share.Tag)
				if err := vm.BindDirReadOnly(share.Source, ro); err != nil {
					return g, fmt.Errorf("volume %s: %w", v.Dest, err)
				}
				undo.add(func() { _ = vm.Unmount(ro) })
				share.Source = ro
			}
			g.shares = append(g.shares, *share)
			g.list = append(g.list, configdrive.Volume{Kind: configdrive.VolumeShare, Name: share.Tag, Path: v.Dest, ReadOnly: v.ReadOnly})
			entry.WithField("source", v.Source).WithField("tag", share.Tag).Info("volume is a virtiofs share")
		}
	}
	return g, nil
}

// In a VM dir, sharesDir holds the read-only bind mounts of read-only
// shares, volumesDir the bind mounts of the disk.img files QEMU opens.
const (
	sharesDir  = "shares"
	volumesDir = "volumes"
)

// prepareVolume decides what the guest gets for one volume: a disk (a
// block device, or the volume's disk.img, pinned at pin) or a share (any
// other directory).
func prepareVolume(ctx context.Context, h *host, v vmplan.Volume, size int64, pin string, id vm.Identity,
	undo *rollback) (*vm.VolumeDisk, *vm.Share, error) {
	if v.Kind == vmplan.VolDevice {
		p, err := blockDeviceNode(v.Major, v.Minor)
		if err != nil {
			return nil, nil, fmt.Errorf("volume %s: %w", v.Dest, err)
		}
		return &vm.VolumeDisk{Path: p, Block: true, Format: "raw"}, nil, nil
	}
	st, err := os.Stat(v.Source)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, nil, fmt.Errorf("volume %s: its host path %s is gone: %w", v.Dest, v.Source, errdefs.ErrFailedPrecondition)
	case err != nil:
		return nil, nil, fmt.Errorf("volume %s: %w", v.Dest, err)
	case st.Mode().Type() == fs.ModeDevice:
		return &vm.VolumeDisk{Path: v.Source, Block: true, Format: "raw"}, nil, nil
	case !st.IsDir():
		return nil, nil, fmt.Errorf("volume %s: host path %s is a %s; only directories (shared, or holding %s) and block devices can be given "+
			"to a VM (a subPath of a single file cannot): %w",
			v.Dest, v.Source, fileKind(st.Mode()), vmplan.DiskImageName, errdefs.ErrInvalidArgument)
	}
	img := filepath.Join(v.Source, vmplan.DiskImageName)
	ist, err := os.Lstat(img)
	switch {
	case err == nil && !ist.Mode().IsRegular():
		return nil, nil, fmt.Errorf("volume %s: %s is a %s, not a disk image file: %w", v.Dest, img, fileKind(ist.Mode()),
			errdefs.ErrInvalidArgument)
	case err == nil:
		d, imgErr := volumeImage(ctx, h, v, img, pin, id, undo)
		return d, nil, imgErr
	case !errors.Is(err, fs.ErrNotExist):
		return nil, nil, fmt.Errorf("volume %s: %w", v.Dest, err)
	case size > 0:
		if createErr := createDiskImage(v, img, size, id, undo); createErr != nil {
			return nil, nil, createErr
		}
		d, imgErr := volumeImage(ctx, h, v, img, pin, id, undo)
		return d, nil, imgErr
	}
	return nil, &vm.Share{Source: v.Source}, nil
}

// volumeImage pins a volume's disk.img at pin (a bind mount of the file
// opened without following links: whoever can write the volume, a guest
// through a share included, cannot swap the checked file for a link to a
// host file before QEMU opens it), then checks it as a containerDisk is
// checked (format by content, no backing file, no external data file).
func volumeImage(ctx context.Context, h *host, v vmplan.Volume, img, pin string, id vm.Identity, undo *rollback) (*vm.VolumeDisk, error) {
	f, err := os.OpenFile(img, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("volume %s: open %s: %v: %w", v.Dest, vmplan.DiskImageName, err, errdefs.ErrInvalidArgument)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		return nil, fmt.Errorf("volume %s: %s is not a regular file (%v): %w", v.Dest, img, err, errdefs.ErrInvalidArgument)
	}
	if v.ReadOnly && !readableBy(st, id) {
		// libvirt gives a VM's disks to its identity at start, but not
		// through a read-only mount (its chown fails with EROFS and is
		// skipped), and a static DAC label carries no supplementary
		// groups: the pod's fsGroup cannot reach QEMU.
		sys := st.Sys().(*syscall.Stat_t)
		return nil, fmt.Errorf("volume %s: the read-only %s (owner %d:%d, mode %#o) is not readable by the VM's uid %d: libvirt "+
			"cannot give it to the VM through a read-only mount, and QEMU runs without the pod's supplemental groups; make it "+
			"world-readable (o+r) or mount the volume read-write: %w",
			v.Dest, vmplan.DiskImageName, sys.Uid, sys.Gid, st.Mode().Perm(), id.UID, errdefs.ErrFailedPrecondition)
	}
	if mkdirErr := os.MkdirAll(filepath.Dir(pin), 0o711); mkdirErr != nil {
		return nil, fmt.Errorf("volume %s: %w", v.Dest, mkdirErr)
	}
	mount := vm.BindFile
	if v.ReadOnly {
		mount = vm.MountReadOnly
	}
	if err = mount(f, pin); err != nil {
		return nil, fmt.Errorf("volume %s: %w", v.Dest, err)
	}
	undo.add(func() { _ = vm.Unmount(pin) })
	info, err := vm.ProbeImage(ctx, h.cfg.QEMUImg, pin, v.Dest+"/"+vmplan.DiskImageName)
	if err != nil {
		return nil, err
	}
	direct, err := vm.SupportsDirectIO(pin)
	if err != nil {
		return nil, fmt.Errorf("volume %s: %w", v.Dest, err)
	}
	return &vm.VolumeDisk{Path: pin, Format: info.Format, HostCache: !direct}, nil
}

// createDiskImage makes the sparse raw disk.img the pod asked for on an
// empty volume (lost+found, as on a fresh ext4 volume, is allowed), the
// VM's identity's alone (mode 0600). A size the volume's file system has no room for is
// refused: the guest would fail writing long after the pod started.
func createDiskImage(v vmplan.Volume, img string, size int64, id vm.Identity, undo *rollback) (retErr error) {
	ents, err := os.ReadDir(v.Source)
	if err != nil {
		return fmt.Errorf("volume %s: %w", v.Dest, err)
	}
	for _, e := range ents {
		if e.Name() != "lost+found" {
			return fmt.Errorf("volume %s: annotation %s asks for a new %s, but the volume is not empty (it has %s): %w",
				v.Dest, annotations.DiskImages, vmplan.DiskImageName, e.Name(), errdefs.ErrInvalidArgument)
		}
	}
	if v.ReadOnly {
		return fmt.Errorf("volume %s: annotation %s asks for a new %s on a read-only volume: %w", v.Dest, annotations.DiskImages,
			vmplan.DiskImageName,
			errdefs.ErrInvalidArgument)
	}
	var sfs unix.Statfs_t
	if err = unix.Statfs(v.Source, &sfs); err != nil {
		return fmt.Errorf("volume %s: %w", v.Dest, err)
	}
	if free := int64(sfs.Bavail) * sfs.Bsize; size > free {
		return fmt.Errorf("volume %s: annotation %s asks for a %d-byte %s; the volume has %d bytes free: %w",
			v.Dest, annotations.DiskImages, size, vmplan.DiskImageName, free, errdefs.ErrInvalidArgument)
	}
	f, err := os.OpenFile(img, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("volume %s: create %s: %w", v.Dest, vmplan.DiskImageName, err)
	}
	undo.add(func() { _ = os.Remove(img) })
	defer func() {
		if err := f.Close(); err != nil && retErr == nil {
			retErr = fmt.Errorf("volume %s: %w", v.Dest, err)
		}
	}()
	if err := f.Truncate(size); err != nil {
		return fmt.Errorf("volume %s: size %s: %w", v.Dest, vmplan.DiskImageName, err)
	}
	if err := f.Chown(int(id.UID), int(id.GID)); err != nil {
		return fmt.Errorf("volume %s: chown %s: %w", v.Dest, vmplan.DiskImageName, err)
	}
	return f.Sync()
}

// blockDeviceNode finds the host node of block device major:minor: the
// kernel's name for it under /dev, checked to be that very device.
func blockDeviceNode(major, minor int64) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/sys/dev/block/%d:%d/uevent", major, minor))
	if err != nil {
		return "", fmt.Errorf("block device %d:%d is not on this host: %v: %w", major, minor, err, errdefs.ErrFailedPrecondition)
	}
	var name string
	for _, l := range strings.Split(string(b), "\n") {
		if n, ok := strings.CutPrefix(l, "DEVNAME="); ok {
			name = n
		}
	}
	if name == "" || strings.Contains(name, "..") {
		return "", fmt.Errorf("block device %d:%d has no usable name (%q): %w", major, minor, name, errdefs.ErrFailedPrecondition)
	}
	p := filepath.Join("/dev", name)
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return "", fmt.Errorf("block device %d:%d: %s: %v: %w", major, minor, p, err, errdefs.ErrFailedPrecondition)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK || int64(unix.Major(st.Rdev)) != major || int64(unix.Minor(st.Rdev)) != minor {
		return "", fmt.Errorf("block device %d:%d: %s is another file: %w", major, minor, p, errdefs.ErrFailedPrecondition)
	}
	return p, nil
}

func fileKind(m fs.FileMode) string {
	switch m.Type() {
	case 0:
		return "regular file"
	case fs.ModeSymlink:
		return "symbolic link"
	case fs.ModeDevice | fs.ModeCharDevice:
		return "character device"
	case fs.ModeNamedPipe:
		return "named pipe"
	case fs.ModeSocket:
		return "socket"
	}
	return "special file"
}

// readableBy reports whether a process running as id alone (no
// supplementary groups) may read a file of mode and owner st.
func readableBy(st fs.FileInfo, id vm.Identity) bool {
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return false
	}
	perm := st.Mode().Perm()
	switch {
	case sys.Uid == id.UID:
		return perm&0o400 != 0
	case sys.Gid == id.GID:
		return perm&0o040 != 0
	}
	return perm&0o004 != 0
}
