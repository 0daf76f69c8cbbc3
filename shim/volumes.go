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
	"github.com/kvm-shim/containerd-shim-kvm-v1/hostid"
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

// volumeUse is what the guest gets for one volume, as the plan decided
// from the spec and a look at the host.
type volumeUse int

const (
	useShare    volumeUse = iota // a directory: a virtiofs share
	useBlock                     // a block device: path is its node
	useImage                     // the volume's disk.img, at path
	useNewImage                  // a disk.img the pod asked for, made at path by the apply
)

// plannedVolume is one volume as the plan decided it.
type plannedVolume struct {
	vmplan.Volume
	use  volumeUse
	path string // the block device node or the disk.img
	size int64  // of a new disk.img
	name string // the guest's name for it: a disk's serial, a share's tag
}

// isDisk reports whether the guest gets the volume as a virtio disk.
func (v plannedVolume) isDisk() bool { return v.use != useShare }

// volumeReader is who must be able to read a read-only disk.img: the VM's
// identity when it is known before the apply (the shared QEMU user), else
// nil (a uid of vm_id_range, allocated by the apply).
type volumeReader struct {
	id      *vm.Identity
	idRange *hostid.Range
}

// planVolumes decides what the guest gets for each volume, looking at the
// host without changing it, and refuses every volume it cannot give. sizes
// are from annotations.DiskImages. The list is what the config drive says.
func planVolumes(vols []vmplan.Volume, sizes map[string]int64, who volumeReader) ([]plannedVolume, []configdrive.Volume, error) {
	for p := range sizes {
		if !slices.ContainsFunc(vols, func(v vmplan.Volume) bool { return v.Kind == vmplan.VolBind && filepath.Clean(v.Dest) == p }) {
			return nil, nil, fmt.Errorf("annotation %s names %s, which is not a volume of the container: %w", annotations.DiskImages, p,
				errdefs.ErrInvalidArgument)
		}
	}
	diskNames, shareNames := vmplan.GuestNames(vols, vm.MaxSerialLen), vmplan.GuestNames(vols, vm.MaxTagLen)
	var planned []plannedVolume
	var list []configdrive.Volume
	disks, shares := 0, 0
	for i, v := range vols {
		pv, err := planVolume(v, sizes[filepath.Clean(v.Dest)], who)
		if err != nil {
			return nil, nil, err
		}
		kind := configdrive.VolumeShare
		if pv.isDisk() {
			if disks++; disks > vm.MaxVolumeDisks {
				return nil, nil, fmt.Errorf("volume %s: more than %d disk volumes (raw block or disk.img): %w", v.Dest, vm.MaxVolumeDisks,
					errdefs.ErrInvalidArgument)
			}
			kind, pv.name = configdrive.VolumeDisk, diskNames[i]
		} else {
			if shares++; shares > vm.MaxShares {
				return nil, nil, fmt.Errorf("volume %s: more than %d shared (virtiofs) volumes: %w", v.Dest, vm.MaxShares,
					errdefs.ErrInvalidArgument)
			}
			pv.name = shareNames[i]
		}
		planned = append(planned, pv)
		list = append(list, configdrive.Volume{Kind: kind, Name: pv.name, Path: v.Dest, ReadOnly: v.ReadOnly})
	}
	return planned, list, nil
}

// planVolume decides what the guest gets for one volume: a disk (a block
// device, or the volume's disk.img, existing or asked for with size) or a
// share (any other directory).
func planVolume(v vmplan.Volume, size int64, who volumeReader) (plannedVolume, error) {
	pv := plannedVolume{Volume: v}
	if v.Kind == vmplan.VolDevice {
		p, err := blockDeviceNode(v.Major, v.Minor)
		if err != nil {
			return pv, fmt.Errorf("volume %s: %w", v.Dest, err)
		}
		pv.use, pv.path = useBlock, p
		return pv, nil
	}
	st, err := os.Stat(v.Source)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return pv, fmt.Errorf("volume %s: its host path %s is gone: %w", v.Dest, v.Source, errdefs.ErrFailedPrecondition)
	case err != nil:
		return pv, fmt.Errorf("volume %s: %w", v.Dest, err)
	case st.Mode().Type() == fs.ModeDevice:
		pv.use, pv.path = useBlock, v.Source
		return pv, nil
	case !st.IsDir():
		return pv, fmt.Errorf("volume %s: host path %s is a %s; only directories (shared, or holding %s) and block devices can be given "+
			"to a VM (a subPath of a single file cannot): %w",
			v.Dest, v.Source, fileKind(st.Mode()), vmplan.DiskImageName, errdefs.ErrInvalidArgument)
	}
	img := filepath.Join(v.Source, vmplan.DiskImageName)
	ist, err := os.Lstat(img)
	switch {
	case err == nil && !ist.Mode().IsRegular():
		return pv, fmt.Errorf("volume %s: %s is a %s, not a disk image file: %w", v.Dest, img, fileKind(ist.Mode()),
			errdefs.ErrInvalidArgument)
	case err == nil:
		pv.use, pv.path = useImage, img
		return pv, checkImageReadable(v, ist, who)
	case !errors.Is(err, fs.ErrNotExist):
		return pv, fmt.Errorf("volume %s: %w", v.Dest, err)
	case size > 0:
		pv.use, pv.path, pv.size = useNewImage, img, size
		return pv, checkNewImage(v, size)
	}
	pv.use = useShare
	return pv, nil
}

// checkImageReadable refuses a read-only disk.img the VM could not read.
// libvirt gives a VM's disks to its identity at start, but not through a
// read-only mount (its chown fails with EROFS and is skipped), and a
// static DAC label carries no supplementary groups: the pod's fsGroup
// cannot reach QEMU. A uid of vm_id_range is not known yet: the file must
// be world-readable, unless it is owned by such a uid (the apply checks
// it again with the VM's own).
func checkImageReadable(v vmplan.Volume, st fs.FileInfo, who volumeReader) error {
	if !v.ReadOnly {
		return nil
	}
	sys := st.Sys().(*syscall.Stat_t)
	switch {
	case who.id != nil && readableBy(st, *who.id):
		return nil
	case who.id == nil && (st.Mode().Perm()&0o004 != 0 || who.idRange != nil && sys.Uid >= who.idRange.First && sys.Uid <= who.idRange.Last):
		return nil
	}
	uid := "the VM's own uid (of vm_id_range)"
	if who.id != nil {
		uid = fmt.Sprintf("the VM's uid %d", who.id.UID)
	}
	return unreadableImage(v, sys, st.Mode().Perm(), uid)
}

// unreadableImage is the refusal of a read-only disk.img uid cannot read.
func unreadableImage(v vmplan.Volume, sys *syscall.Stat_t, perm fs.FileMode, uid string) error {
	return fmt.Errorf("volume %s: the read-only %s (owner %d:%d, mode %#o) is not readable by %s: libvirt "+
		"cannot give it to the VM through a read-only mount, and QEMU runs without the pod's supplemental groups; make it "+
		"world-readable (o+r) or mount the volume read-write: %w",
		v.Dest, vmplan.DiskImageName, sys.Uid, sys.Gid, perm, uid, errdefs.ErrFailedPrecondition)
}

// checkNewImage refuses a disk.img the pod asked for that cannot be made:
// on a volume that is not empty (lost+found, as on a fresh ext4 volume, is
// allowed), on a read-only volume, or larger than the volume's free space
// (the guest would fail writing long after the pod started).
func checkNewImage(v vmplan.Volume, size int64) error {
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
			vmplan.DiskImageName, errdefs.ErrInvalidArgument)
	}
	var sfs unix.Statfs_t
	if err = unix.Statfs(v.Source, &sfs); err != nil {
		return fmt.Errorf("volume %s: %w", v.Dest, err)
	}
	if free := int64(sfs.Bavail) * sfs.Bsize; size > free {
		return fmt.Errorf("volume %s: annotation %s asks for a %d-byte %s; the volume has %d bytes free: %w",
			v.Dest, annotations.DiskImages, size, vmplan.DiskImageName, free, errdefs.ErrInvalidArgument)
	}
	return nil
}

// guestVolumes is what the guest gets for the pod's volumes.
type guestVolumes struct {
	disks  []vm.VolumeDisk
	shares []vm.Share
}

// volumeApply makes what the planned volumes need on the host: the
// disk.img files the pod asked for, bind mounts of disk.img files under
// vmDir/volumes and read-only bind mounts of read-only shares under
// vmDir/shares. Each undo goes to undo as soon as its step succeeded (a
// crashed shim's cleanup finds the mounts by readOnlyMounts).
type volumeApply struct {
	h     *host
	vmDir string
	id    vm.Identity
	undo  *rollback
}

// prepareVolumes turns each planned volume into a disk or a share.
func (a *volumeApply) prepareVolumes(ctx context.Context, vols []plannedVolume) (guestVolumes, error) {
	var g guestVolumes
	for _, v := range vols {
		entry := log.G(ctx).WithField("volume", v.Dest).WithField("readOnly", v.ReadOnly)
		if !v.isDisk() {
			share, err := a.share(v)
			if err != nil {
				return g, err
			}
			g.shares = append(g.shares, share)
			entry.WithField("source", v.Source).WithField("tag", share.Tag).Info("volume is a virtiofs share")
			continue
		}
		disk, err := a.disk(ctx, v)
		if err != nil {
			return g, err
		}
		disk.Name, disk.Serial, disk.ReadOnly = v.Dest, v.name, v.ReadOnly
		g.disks = append(g.disks, disk)
		entry.WithField("path", disk.Path).WithField("source", v.Source).WithField("serial", disk.Serial).Info("volume is a virtio disk")
	}
	return g, nil
}

// share is a volume's virtiofs share. libvirt 9.0 has no read-only
// virtiofs: virtiofsd serves a read-only bind mount of a read-only
// volume, so the guest cannot write whatever it mounts.
func (a *volumeApply) share(v plannedVolume) (vm.Share, error) {
	share := vm.Share{Name: v.Dest, Tag: v.name, Source: v.Source}
	if v.ReadOnly {
		ro := filepath.Join(a.vmDir, sharesDir, share.Tag)
		if err := vm.BindDirReadOnly(share.Source, ro); err != nil {
			return share, fmt.Errorf("volume %s: %w", v.Dest, err)
		}
		a.undo.add(func() { _ = vm.Unmount(ro) })
		share.Source = ro
	}
	return share, nil
}

// disk is a volume's virtio disk: a block device, or its disk.img (made
// first when the pod asked for a new one) pinned under the VM dir.
func (a *volumeApply) disk(ctx context.Context, v plannedVolume) (vm.VolumeDisk, error) {
	switch v.use {
	case useBlock:
		return vm.VolumeDisk{Path: v.path, Block: true, Format: "raw"}, nil
	case useNewImage:
		if err := createDiskImage(v, a.id, a.undo); err != nil {
			return vm.VolumeDisk{}, err
		}
	}
	return a.volumeImage(ctx, v, filepath.Join(a.vmDir, volumesDir, v.name+".img"))
}

// In a VM dir, sharesDir holds the read-only bind mounts of read-only
// shares, volumesDir the bind mounts of the disk.img files QEMU opens.
const (
	sharesDir  = "shares"
	volumesDir = "volumes"
)

// volumeImage pins a volume's disk.img at pin (a bind mount of the file
// opened without following links: whoever can write the volume, a guest
// through a share included, cannot swap the checked file for a link to a
// host file before QEMU opens it), then checks it as a containerDisk is
// checked (format by content, no backing file, no external data file).
// The plan looked at the file already; what it found is checked again
// on the file opened.
func (a *volumeApply) volumeImage(ctx context.Context, v plannedVolume, pin string) (vm.VolumeDisk, error) {
	var none vm.VolumeDisk
	f, err := os.OpenFile(v.path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return none, fmt.Errorf("volume %s: open %s: %v: %w", v.Dest, vmplan.DiskImageName, err, errdefs.ErrInvalidArgument)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		return none, fmt.Errorf("volume %s: %s is not a regular file (%v): %w", v.Dest, v.path, err, errdefs.ErrInvalidArgument)
	}
	if v.ReadOnly && !readableBy(st, a.id) {
		return none, unreadableImage(v.Volume, st.Sys().(*syscall.Stat_t), st.Mode().Perm(), fmt.Sprintf("the VM's uid %d", a.id.UID))
	}
	if mkdirErr := os.MkdirAll(filepath.Dir(pin), 0o711); mkdirErr != nil {
		return none, fmt.Errorf("volume %s: %w", v.Dest, mkdirErr)
	}
	mount := vm.BindFile
	if v.ReadOnly {
		mount = vm.MountReadOnly
	}
	if err = mount(f, pin); err != nil {
		return none, fmt.Errorf("volume %s: %w", v.Dest, err)
	}
	a.undo.add(func() { _ = vm.Unmount(pin) })
	info, err := vm.ProbeImage(ctx, a.h.cfg.QEMUImg, pin, v.Dest+"/"+vmplan.DiskImageName)
	if err != nil {
		return none, err
	}
	direct, err := vm.SupportsDirectIO(pin)
	if err != nil {
		return none, fmt.Errorf("volume %s: %w", v.Dest, err)
	}
	return vm.VolumeDisk{Path: pin, Format: info.Format, HostCache: !direct}, nil
}

// createDiskImage makes the sparse raw disk.img the pod asked for (the
// plan checked that it can be made), the VM's identity's alone (mode
// 0600).
func createDiskImage(v plannedVolume, id vm.Identity, undo *rollback) (retErr error) {
	f, err := os.OpenFile(v.path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("volume %s: create %s: %w", v.Dest, vmplan.DiskImageName, err)
	}
	undo.add(func() { _ = os.Remove(v.path) })
	defer func() {
		if err := f.Close(); err != nil && retErr == nil {
			retErr = fmt.Errorf("volume %s: %w", v.Dest, err)
		}
	}()
	if err := f.Truncate(v.size); err != nil {
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
