package shim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
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
)

// diskImageName is KubeVirt's convention: a filesystem volume whose root
// holds this file is the VM's disk, not a directory to share.
const diskImageName = "disk.img"

// plumbing is what happens to CRI's own mounts, which are not volumes:
// the guest has its own files and kernel file systems.
var plumbing = map[string]string{
	"/etc/hosts":           "the guest keeps its own /etc/hosts",
	"/etc/hostname":        "the guest's hostname comes from the config drive",
	"/etc/resolv.conf":     "the guest's DNS servers come from the config drive (or ip= for direct boot)",
	"/dev/shm":             "the guest has its own /dev/shm",
	"/dev/termination-log": "a VM writes no termination message; kubelet finds it empty",
}

// terminationMessage matches the file kubelet mounts at a container's
// terminationMessagePath when the pod sets another path than
// /dev/termination-log: <kubelet root>/pods/<uid>/containers/<name>/<id>.
var terminationMessage = regexp.MustCompile(`/pods/[^/]+/containers/[^/]+/[^/]+$`)

// volumeKind is what the OCI spec says a volume is; prepareVolumes looks
// at the host to decide what the guest gets.
type volumeKind int

const (
	volDevice volumeKind = iota // linux.devices entry of type b: a raw block volume
	volBind                     // bind mount: a block device, a directory with disk.img, or a share
)

// volume is one pod volume as the OCI spec gives it.
type volume struct {
	kind         volumeKind
	dest         string // container path: the volume's name in messages
	source       string // host path of a bind mount
	major, minor int64  // of a device
	readOnly     bool
}

// classifyVolumes reads the volumes out of the container's OCI spec:
// linux.devices of type b and every bind mount that is not CRI plumbing.
// Kernel file systems (proc, sysfs, tmpfs, devpts, mqueue, cgroup) and
// plumbing mounts are left out with one info log line; a device the guest
// cannot get (character devices) is an error naming it.
func classifyVolumes(ctx context.Context, spec *specs.Spec) ([]volume, error) {
	var vols []volume
	var skipped []string
	seen := map[string]bool{}
	if spec.Linux != nil {
		for _, d := range spec.Linux.Devices {
			if d.Type != "b" {
				return nil, fmt.Errorf("device %s (type %s, %d:%d): only block devices can be given to a VM: %w", d.Path, d.Type, d.Major, d.Minor,
					errdefs.ErrInvalidArgument)
			}
			if err := configdrive.CheckVolumePath(d.Path); err != nil {
				return nil, err
			}
			vols = append(vols, volume{kind: volDevice, dest: d.Path, major: d.Major, minor: d.Minor, readOnly: !deviceWritable(spec, d)})
			seen[d.Path] = true
		}
	}
	for _, m := range spec.Mounts {
		bind := m.Type == "bind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind")
		switch why, ok := plumbing[m.Destination]; {
		case !bind:
			skipped = append(skipped, m.Destination+" ("+m.Type+": the guest has its own)")
			continue
		case ok:
			skipped = append(skipped, m.Destination+" ("+why+")")
			continue
		case terminationMessage.MatchString(m.Source):
			skipped = append(skipped, m.Destination+" ("+plumbing["/dev/termination-log"]+")")
			continue
		case seen[m.Destination]:
			continue // the node of a raw block device, already a device
		}
		if err := configdrive.CheckVolumePath(m.Destination); err != nil {
			return nil, err
		}
		vols = append(vols, volume{kind: volBind, dest: m.Destination, source: m.Source, readOnly: slices.Contains(m.Options, "ro")})
		seen[m.Destination] = true
	}
	if len(skipped) > 0 {
		log.G(ctx).WithField("mounts", strings.Join(skipped, ", ")).Info("mounts not given to the VM")
	}
	return vols, nil
}

// deviceWritable reads the cgroup rule CRI wrote for the device: the last
// rule that matches decides, and none matching leaves it writable.
func deviceWritable(spec *specs.Spec, d specs.LinuxDevice) bool {
	w := true
	if spec.Linux.Resources == nil {
		return w
	}
	for _, r := range spec.Linux.Resources.Devices {
		if !r.Allow || (r.Type != "" && r.Type != "a" && r.Type != d.Type) ||
			(r.Major != nil && *r.Major != d.Major) || (r.Minor != nil && *r.Minor != d.Minor) {
			continue
		}
		w = strings.Contains(r.Access, "w")
	}
	return w
}

// diskImageSizes reads annotations.DiskImages.
func diskImageSizes(spec *specs.Spec) (map[string]int64, error) {
	v, ok := spec.Annotations[annotations.DiskImages]
	if !ok {
		return nil, nil
	}
	sizes := map[string]int64{}
	for _, e := range strings.Split(v, ",") {
		p, size, ok := strings.Cut(strings.TrimSpace(e), "=")
		if !ok || !strings.HasPrefix(p, "/") {
			return nil, fmt.Errorf("annotation %s = %q: entry %q: want <container path>=<size>: %w", annotations.DiskImages, v, e,
				errdefs.ErrInvalidArgument)
		}
		b, err := parseSize(size)
		if err != nil {
			return nil, fmt.Errorf("annotation %s: volume %s: %v: %w", annotations.DiskImages, p, err, errdefs.ErrInvalidArgument)
		}
		sizes[filepath.Clean(p)] = b
	}
	return sizes, nil
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
func prepareVolumes(ctx context.Context, h *host, vols []volume, sizes map[string]int64, vmDir string, id vm.Identity,
	undo *rollback) (guestVolumes, error) {
	var g guestVolumes
	diskNames, shareNames := guestNames(vols, vm.MaxSerialLen), guestNames(vols, vm.MaxTagLen)
	for p := range sizes {
		if !slices.ContainsFunc(vols, func(v volume) bool { return v.kind == volBind && filepath.Clean(v.dest) == p }) {
			return g, fmt.Errorf("annotation %s names %s, which is not a volume of the container: %w", annotations.DiskImages, p,
				errdefs.ErrInvalidArgument)
		}
	}
	for i, v := range vols {
		pin := filepath.Join(vmDir, volumesDir, diskNames[i]+".img")
		disk, share, err := prepareVolume(ctx, h, v, sizes[filepath.Clean(v.dest)], pin, id, undo)
		if err != nil {
			return g, err
		}
		entry := log.G(ctx).WithField("volume", v.dest).WithField("readOnly", v.readOnly)
		switch {
		case disk != nil:
			if len(g.disks) == vm.MaxVolumeDisks {
				return g, fmt.Errorf("volume %s: more than %d disk volumes (raw block or disk.img): %w", v.dest, vm.MaxVolumeDisks,
					errdefs.ErrInvalidArgument)
			}
			disk.Name, disk.Serial, disk.ReadOnly = v.dest, diskNames[i], v.readOnly
			g.disks = append(g.disks, *disk)
			g.list = append(g.list, configdrive.Volume{Kind: configdrive.VolumeDisk, Name: disk.Serial, Path: v.dest, ReadOnly: v.readOnly})
			entry.WithField("path", disk.Path).WithField("source", v.source).WithField("serial", disk.Serial).Info("volume is a virtio disk")
		default:
			if len(g.shares) == vm.MaxShares {
				return g, fmt.Errorf("volume %s: more than %d shared (virtiofs) volumes: %w", v.dest, vm.MaxShares, errdefs.ErrInvalidArgument)
			}
			share.Name, share.Tag = v.dest, shareNames[i]
			if v.readOnly {
				// libvirt 9.0 has no read-only virtiofs: virtiofsd serves a
				// read-only bind mount, so the guest cannot write whatever
				// it mounts.
				ro := filepath.Join(vmDir, sharesDir, share.Tag)
				if err := vm.BindDirReadOnly(share.Source, ro); err != nil {
					return g, fmt.Errorf("volume %s: %w", v.dest, err)
				}
				undo.add(func() { _ = vm.Unmount(ro) })
				share.Source = ro
			}
			g.shares = append(g.shares, *share)
			g.list = append(g.list, configdrive.Volume{Kind: configdrive.VolumeShare, Name: share.Tag, Path: v.dest, ReadOnly: v.readOnly})
			entry.WithField("source", v.source).WithField("tag", share.Tag).Info("volume is a virtiofs share")
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
func prepareVolume(ctx context.Context, h *host, v volume, size int64, pin string, id vm.Identity,
	undo *rollback) (*vm.VolumeDisk, *vm.Share, error) {
	if v.kind == volDevice {
		p, err := blockDeviceNode(v.major, v.minor)
		if err != nil {
			return nil, nil, fmt.Errorf("volume %s: %w", v.dest, err)
		}
		return &vm.VolumeDisk{Path: p, Block: true, Format: "raw"}, nil, nil
	}
	st, err := os.Stat(v.source)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, nil, fmt.Errorf("volume %s: its host path %s is gone: %w", v.dest, v.source, errdefs.ErrFailedPrecondition)
	case err != nil:
		return nil, nil, fmt.Errorf("volume %s: %w", v.dest, err)
	case st.Mode().Type() == fs.ModeDevice:
		return &vm.VolumeDisk{Path: v.source, Block: true, Format: "raw"}, nil, nil
	case !st.IsDir():
		return nil, nil, fmt.Errorf("volume %s: host path %s is a %s; only directories (shared, or holding %s) and block devices can be given "+
			"to a VM (a subPath of a single file cannot): %w",
			v.dest, v.source, fileKind(st.Mode()), diskImageName, errdefs.ErrInvalidArgument)
	}
	img := filepath.Join(v.source, diskImageName)
	ist, err := os.Lstat(img)
	switch {
	case err == nil && !ist.Mode().IsRegular():
		return nil, nil, fmt.Errorf("volume %s: %s is a %s, not a disk image file: %w", v.dest, img, fileKind(ist.Mode()),
			errdefs.ErrInvalidArgument)
	case err == nil:
		d, imgErr := volumeImage(ctx, h, v, img, pin, id, undo)
		return d, nil, imgErr
	case !errors.Is(err, fs.ErrNotExist):
		return nil, nil, fmt.Errorf("volume %s: %w", v.dest, err)
	case size > 0:
		if createErr := createDiskImage(v, img, size, id, undo); createErr != nil {
			return nil, nil, createErr
		}
		d, imgErr := volumeImage(ctx, h, v, img, pin, id, undo)
		return d, nil, imgErr
	}
	return nil, &vm.Share{Source: v.source}, nil
}

// volumeImage pins a volume's disk.img at pin (a bind mount of the file
// opened without following links: whoever can write the volume, a guest
// through a share included, cannot swap the checked file for a link to a
// host file before QEMU opens it), then checks it as a containerDisk is
// checked (format by content, no backing file, no external data file).
func volumeImage(ctx context.Context, h *host, v volume, img, pin string, id vm.Identity, undo *rollback) (*vm.VolumeDisk, error) {
	f, err := os.OpenFile(img, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("volume %s: open %s: %v: %w", v.dest, diskImageName, err, errdefs.ErrInvalidArgument)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		return nil, fmt.Errorf("volume %s: %s is not a regular file (%v): %w", v.dest, img, err, errdefs.ErrInvalidArgument)
	}
	if v.readOnly && !readableBy(st, id) {
		// libvirt gives a VM's disks to its identity at start, but not
		// through a read-only mount (its chown fails with EROFS and is
		// skipped), and a static DAC label carries no supplementary
		// groups: the pod's fsGroup cannot reach QEMU.
		sys := st.Sys().(*syscall.Stat_t)
		return nil, fmt.Errorf("volume %s: the read-only %s (owner %d:%d, mode %#o) is not readable by the VM's uid %d: libvirt "+
			"cannot give it to the VM through a read-only mount, and QEMU runs without the pod's supplemental groups; make it "+
			"world-readable (o+r) or mount the volume read-write: %w",
			v.dest, diskImageName, sys.Uid, sys.Gid, st.Mode().Perm(), id.UID, errdefs.ErrFailedPrecondition)
	}
	if mkdirErr := os.MkdirAll(filepath.Dir(pin), 0o711); mkdirErr != nil {
		return nil, fmt.Errorf("volume %s: %w", v.dest, mkdirErr)
	}
	mount := vm.BindFile
	if v.readOnly {
		mount = vm.MountReadOnly
	}
	if err = mount(f, pin); err != nil {
		return nil, fmt.Errorf("volume %s: %w", v.dest, err)
	}
	undo.add(func() { _ = vm.Unmount(pin) })
	info, err := vm.ProbeImage(ctx, h.cfg.QEMUImg, pin, v.dest+"/"+diskImageName)
	if err != nil {
		return nil, err
	}
	direct, err := vm.SupportsDirectIO(pin)
	if err != nil {
		return nil, fmt.Errorf("volume %s: %w", v.dest, err)
	}
	return &vm.VolumeDisk{Path: pin, Format: info.Format, HostCache: !direct}, nil
}

// createDiskImage makes the sparse raw disk.img the pod asked for on an
// empty volume (lost+found, as on a fresh ext4 volume, is allowed), the
// VM's identity's alone (mode 0600). A size the volume's file system has no room for is
// refused: the guest would fail writing long after the pod started.
func createDiskImage(v volume, img string, size int64, id vm.Identity, undo *rollback) (retErr error) {
	ents, err := os.ReadDir(v.source)
	if err != nil {
		return fmt.Errorf("volume %s: %w", v.dest, err)
	}
	for _, e := range ents {
		if e.Name() != "lost+found" {
			return fmt.Errorf("volume %s: annotation %s asks for a new %s, but the volume is not empty (it has %s): %w",
				v.dest, annotations.DiskImages, diskImageName, e.Name(), errdefs.ErrInvalidArgument)
		}
	}
	if v.readOnly {
		return fmt.Errorf("volume %s: annotation %s asks for a new %s on a read-only volume: %w", v.dest, annotations.DiskImages, diskImageName,
			errdefs.ErrInvalidArgument)
	}
	var sfs unix.Statfs_t
	if err = unix.Statfs(v.source, &sfs); err != nil {
		return fmt.Errorf("volume %s: %w", v.dest, err)
	}
	if free := int64(sfs.Bavail) * sfs.Bsize; size > free {
		return fmt.Errorf("volume %s: annotation %s asks for a %d-byte %s; the volume has %d bytes free: %w",
			v.dest, annotations.DiskImages, size, diskImageName, free, errdefs.ErrInvalidArgument)
	}
	f, err := os.OpenFile(img, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("volume %s: create %s: %w", v.dest, diskImageName, err)
	}
	undo.add(func() { _ = os.Remove(img) })
	defer func() {
		if err := f.Close(); err != nil && retErr == nil {
			retErr = fmt.Errorf("volume %s: %w", v.dest, err)
		}
	}()
	if err := f.Truncate(size); err != nil {
		return fmt.Errorf("volume %s: size %s: %w", v.dest, diskImageName, err)
	}
	if err := f.Chown(int(id.UID), int(id.GID)); err != nil {
		return fmt.Errorf("volume %s: chown %s: %w", v.dest, diskImageName, err)
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

// guestNames gives each volume the name the guest finds it by (a
// virtio-blk serial, or a virtiofs tag) of at most maxLen characters: the
// container path without its leading slash, other slashes as '-' and any
// character outside [A-Za-z0-9_.+-] as '_' ("/etc/app" is "etc-app",
// "/dev/xvda" is "dev-xvda"). A name longer than maxLen, or one two volumes
// would share ("/a-b" and "/a/b"), is its first maxLen-9 characters, '-' and
// the first 8 hex digits of the SHA-256 of the container path.
func guestNames(vols []volume, maxLen int) []string {
	names := make([]string, len(vols))
	count := map[string]int{}
	for i, v := range vols {
		names[i] = plainName(v.dest)
		count[names[i]]++
	}
	for i, v := range vols {
		if n := names[i]; len(n) > maxLen || count[n] > 1 {
			sum := sha256.Sum256([]byte(v.dest))
			names[i] = n[:min(len(n), maxLen-9)] + "-" + hex.EncodeToString(sum[:4])
		}
	}
	return names
}

func plainName(dest string) string {
	p := strings.Trim(filepath.Clean(dest), "/")
	if p == "" {
		return "root"
	}
	return strings.Map(func(r rune) rune {
		switch {
		case r == '/':
			return '-'
		case r < 0x80 && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_.+-", r)):
			return r
		}
		return '_'
	}, p)
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
