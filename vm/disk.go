package vm

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/atomicfile"
	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/childproc"
)

// ImageInfo is what qemu-img reports about a base image.
type ImageInfo struct {
	Format      string `json:"format"`
	VirtualSize int64  `json:"virtual-size"`
	BackingFile string `json:"backing-filename"`
}

// MountReadOnly bind-mounts the already opened file f read-only onto target
// (created as an empty file). The image inside the container rootfs is
// never chowned, relabelled or written: on overlayfs any metadata change
// would copy the whole image up.
func MountReadOnly(f *os.File, target string) (retErr error) {
	if err := BindFile(f, target); err != nil {
		return err
	}
	if err := unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		_ = Unmount(target)
		return fmt.Errorf("make %s read-only: %w", target, err)
	}
	return nil
}

// BindFile bind-mounts the already opened file f onto target (created as
// an empty file): target is that very file, whatever later happens to the
// path f was opened by.
func BindFile(f *os.File, target string) error {
	if err := os.WriteFile(target, nil, 0o600); err != nil {
		return fmt.Errorf("create mount point %s: %w", target, err)
	}
	src := fmt.Sprintf("/proc/self/fd/%d", f.Fd())
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		_ = Unmount(target)
		return fmt.Errorf("bind-mount %s on %s: %w", f.Name(), target, err)
	}
	return nil
}

// Unmount detaches whatever is mounted on target and removes the mount
// point. Nothing mounted and no file are not errors.
func Unmount(target string) error {
	for {
		err := unix.Unmount(target, unix.MNT_DETACH)
		if err == nil {
			continue // stacked mounts: unmount until none is left
		}
		if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("unmount %s: %w", target, err)
		}
		break
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove mount point %s: %w", target, err)
	}
	return nil
}

// ProbeImage asks qemu-img what the base image at p is. name is the image's
// path as the user knows it, for messages. The format is fixed by the file
// extension where it says one (.qcow2, .raw); an .img is qcow2 when it
// starts like one, else raw. qemu-img runs as root and never probes.
//
// A qcow2 image may name host files: a backing file, or an external data
// file holding its clusters. Either would be resolved on the host, by
// qemu-img here and by QEMU later, so both are refused from the image's
// header before any tool opens it.
func ProbeImage(ctx context.Context, qemuImg, p, name string) (ImageInfo, error) {
	format, err := imageFormat(p, name)
	if err != nil {
		return ImageInfo{}, err
	}
	out, err := runTool(ctx, qemuImg, "info", "--output=json", "-f", format, p)
	if err != nil {
		return ImageInfo{}, fmt.Errorf("disk image %s is not usable: %v: %w", name, err, errdefs.ErrInvalidArgument)
	}
	var info ImageInfo
	if err := json.Unmarshal(out, &info); err != nil {
		return ImageInfo{}, fmt.Errorf("disk image %s: cannot parse qemu-img output: %w", name, err)
	}
	switch {
	case info.Format != format:
		return ImageInfo{}, fmt.Errorf("disk image %s: qemu-img reports format %q, not %s: %w", name, info.Format, format,
			errdefs.ErrInvalidArgument)
	case info.BackingFile != "":
		return ImageInfo{}, fmt.Errorf("disk image %s has a backing file (%s); only self-contained images are supported: %w", name,
			info.BackingFile, errdefs.ErrInvalidArgument)
	case info.VirtualSize <= 0:
		return ImageInfo{}, fmt.Errorf("disk image %s is empty: %w", name, errdefs.ErrInvalidArgument)
	}
	return info, nil
}

// The parts of a qcow2 header (docs/interop/qcow2.txt in QEMU) that say
// whether the image refers to other files.
const (
	qcow2Magic          = "QFI\xfb"
	qcow2BackingOffset  = 8  // uint64, 0: no backing file
	qcow2IncompatOffset = 72 // uint64, version 3 and later
	qcow2V3HeaderLen    = 104
	qcow2DataFileBit    = 1 << 2 // incompatible feature: external data file
)

// imageFormat decides the image's format without running a tool, and
// refuses qcow2 images that refer to other files.
func imageFormat(p, name string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", fmt.Errorf("disk image %s: %w", name, err)
	}
	defer f.Close()
	hdr := make([]byte, qcow2V3HeaderLen)
	n, err := io.ReadFull(f, hdr)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("disk image %s: read header: %w", name, err)
	}
	hdr = hdr[:n]
	isQcow2 := n >= 4 && string(hdr[:4]) == qcow2Magic
	switch strings.ToLower(filepath.Ext(name)) {
	case ".raw":
		return "raw", nil
	case ".qcow2":
		if !isQcow2 {
			return "", fmt.Errorf("disk image %s is not a qcow2 image (no qcow2 header): %w", name, errdefs.ErrInvalidArgument)
		}
	default:
		if !isQcow2 {
			return "raw", nil
		}
	}
	if n < qcow2IncompatOffset {
		return "", fmt.Errorf("disk image %s: qcow2 header is truncated: %w", name, errdefs.ErrInvalidArgument)
	}
	if binary.BigEndian.Uint64(hdr[qcow2BackingOffset:]) != 0 {
		return "", fmt.Errorf("disk image %s has a backing file; only self-contained images are supported: %w", name, errdefs.ErrInvalidArgument)
	}
	if version := binary.BigEndian.Uint32(hdr[4:]); version >= 3 {
		if n < qcow2IncompatOffset+8 {
			return "", fmt.Errorf("disk image %s: qcow2 header is truncated: %w", name, errdefs.ErrInvalidArgument)
		}
		if binary.BigEndian.Uint64(hdr[qcow2IncompatOffset:])&qcow2DataFileBit != 0 {
			return "", fmt.Errorf("disk image %s keeps its data in an external file; only self-contained images are supported: %w", name,
				errdefs.ErrInvalidArgument)
		}
	}
	return "qcow2", nil
}

// OverlayOrigin is what a kept overlay was made on. It is stored next to
// the overlay, so that a restarted container's disk is only re-pointed at
// the very file it was made on.
//
// That file is known by its inode, size, mtime and ctime, not by its
// content: a checksum would read the whole image at every start. With
// containerd's overlayfs snapshotter (the default) a file of an image
// layer keeps its inode in every container made from that layer, across
// reboots too, and its ctime is when the layer was unpacked (setting the
// mtime from the tar sets it; nothing changes it later). So a restarted
// container of the same image matches, and a file unpacked anew does not,
// even with a reused inode number and the same size and mtime. The price:
// an image unpacked again after garbage collection, or a snapshotter that
// copies files per container (native), does not match either.
type OverlayOrigin struct {
	Image       string `json:"image,omitempty"` // the container image's name, when CRI gives it; for messages
	Path        string `json:"path"`            // the disk image's path in the container image
	Format      string `json:"format"`
	VirtualSize int64  `json:"virtualSize"`
	File        FileID `json:"file"`
}

// FileID tells one file of a snapshot from another; the device is left
// out, since every overlay mount has its own.
type FileID struct {
	Inode      uint64 `json:"inode"`
	Size       int64  `json:"size"`
	ModTime    int64  `json:"mtimeNs"`
	ChangeTime int64  `json:"ctimeNs"`
}

// IdentifyFile returns the FileID of the open file f.
func IdentifyFile(f *os.File) (FileID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return FileID{}, fmt.Errorf("stat %s: %w", f.Name(), err)
	}
	return FileID{Inode: st.Ino, Size: st.Size, ModTime: st.Mtim.Nano(), ChangeTime: st.Ctim.Nano()}, nil
}

func (o OverlayOrigin) sameFile(p OverlayOrigin) bool {
	o.Image, p.Image = "", ""
	return o == p
}

func (o OverlayOrigin) String() string {
	s := fmt.Sprintf("%s (%s, %d bytes, inode %d)", o.Path, o.Format, o.VirtualSize, o.File.Inode)
	if o.Image != "" {
		s += " of image " + o.Image
	}
	return s
}

// originPath is where the origin of the overlay at overlay is kept.
func originPath(overlay string) string { return overlay + ".origin.json" }

// EnsureOverlay creates a qcow2 overlay at overlay on top of base, unless
// one is already there: a restarted container keeps its data. A kept
// overlay records the path of the base it was made on, and every container
// mounts its image at a path of its own, so the overlay is re-pointed at
// base (its header only), once origin shows that base is the same file. An
// overlay made on anything else, or without a record of its origin, is
// refused and left as it is. It reports whether it created the overlay; if
// so, remove OverlayFiles on undo.
func EnsureOverlay(ctx context.Context, qemuImg, base string, origin OverlayOrigin, overlay string) (bool, error) {
	if _, err := os.Stat(overlay); errors.Is(err, fs.ErrNotExist) {
		return true, createOverlay(ctx, qemuImg, base, origin, overlay)
	} else if err != nil {
		return false, fmt.Errorf("stat overlay %s: %w", overlay, err)
	}
	b, err := os.ReadFile(originPath(overlay))
	if errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("the pod keeps a disk for this container (%s) with no record of the image it was made on: recreate the pod "+
			"for a new disk: %w",
			overlay, errdefs.ErrFailedPrecondition)
	} else if err != nil {
		return false, fmt.Errorf("read the origin of the kept disk %s: %w", overlay, err)
	}
	var was OverlayOrigin
	if err := json.Unmarshal(b, &was); err != nil {
		return false, fmt.Errorf("read the origin of the kept disk %s: %w", overlay, err)
	}
	if !was.sameFile(origin) {
		return false, fmt.Errorf("the pod keeps this container's disk, made on %s, but the container now has %s: a disk is only reused on the "+
			"image file it was made on; recreate the pod for a new disk: %w",
			was, origin, errdefs.ErrFailedPrecondition)
	}
	if _, err := runTool(ctx, qemuImg, "rebase", "-q", "-u", "-f", "qcow2", "-F", origin.Format, "-b", base, overlay); err != nil {
		return false, fmt.Errorf("point the kept disk %s at this container's image: %w", overlay, err)
	}
	return false, nil
}

// createOverlay makes the overlay under a temporary name and renames it
// into place after its origin is written, each synced first: a crash or a
// power loss in between never leaves an overlay that a restart would
// refuse for want of its origin.
func createOverlay(ctx context.Context, qemuImg, base string, origin OverlayOrigin, overlay string) error {
	tmp := overlay + ".tmp"
	_ = os.Remove(tmp) // left by a crash
	if _, err := runTool(ctx, qemuImg, "create", "-q", "-f", "qcow2", "-F", origin.Format, "-b", base, tmp); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("create overlay %s: %w", overlay, err)
	}
	err := syncFile(tmp)
	if err == nil {
		err = writeOrigin(origin, overlay)
	}
	if err == nil {
		err = os.Rename(tmp, overlay)
	}
	if err == nil {
		err = syncFile(filepath.Dir(overlay))
	}
	if err != nil {
		_ = os.Remove(tmp)
		_ = os.Remove(overlay)
		_ = os.Remove(originPath(overlay))
		return fmt.Errorf("create overlay %s: %w", overlay, err)
	}
	return nil
}

// writeOrigin writes the origin file atomically.
func writeOrigin(origin OverlayOrigin, overlay string) error {
	b, err := json.Marshal(origin)
	if err != nil {
		return err
	}
	// Data synced before the rename, so the origin never names lost
	// data; createOverlay syncs the directory once the overlay is
	// renamed beside it. The fixed temporary name is one OverlayFiles
	// lists, so a crash's leftover is cleaned up with the disk.
	p := originPath(overlay)
	err = atomicfile.WriteFile(p, b, atomicfile.Options{Perm: 0o600, Durability: atomicfile.SyncData, Temp: p + ".tmp"})
	if err != nil {
		return fmt.Errorf("record the origin of disk %s: %w", overlay, err)
	}
	return nil
}

// syncFile flushes the file or directory at p to disk.
func syncFile(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// OverlayFiles lists the files of the overlay at overlay.
func OverlayFiles(overlay string) []string {
	return []string{overlay, originPath(overlay), overlay + ".tmp", originPath(overlay) + ".tmp"}
}

// CopyFile copies the open file f to a new file dst readable by QEMU. Used
// for kernels and initrds that QEMU's user may not read where they are, so
// that libvirt's labelling of them never touches the container rootfs.
func CopyFile(f *os.File, dst string) (retErr error) {
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("create %s: %w", dst, err)
	}
	defer func() {
		if cerr := out.Close(); retErr == nil && cerr != nil {
			retErr = fmt.Errorf("write %s: %w", dst, cerr)
		}
		if retErr != nil {
			_ = os.Remove(dst)
		}
	}()
	if _, err := io.Copy(out, f); err != nil {
		return fmt.Errorf("copy %s to %s: %w", f.Name(), dst, err)
	}
	return nil
}

// runTool runs a helper binary with an argument vector (never a shell) and
// returns its stdout, or an error carrying its stderr.
func runTool(ctx context.Context, bin string, args ...string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := childproc.Run(cmd); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = err.Error()
		}
		return nil, errors.New(msg)
	}
	return stdout.Bytes(), nil
}
