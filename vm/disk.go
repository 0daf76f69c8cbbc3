package vm

import (
	"bytes"
	"context"
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
	if err := os.WriteFile(target, nil, 0o600); err != nil {
		return fmt.Errorf("create mount point %s: %w", target, err)
	}
	defer func() {
		if retErr != nil {
			_ = Unmount(target)
		}
	}()
	src := fmt.Sprintf("/proc/self/fd/%d", f.Fd())
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mount %s on %s: %w", f.Name(), target, err)
	}
	if err := unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("make %s read-only: %w", target, err)
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
// extension where it says one (.qcow2, .raw) and probed for .img; images
// with a backing file are refused, since the backing path would be
// resolved on the host.
func ProbeImage(ctx context.Context, qemuImg, p, name string) (ImageInfo, error) {
	args := []string{"info", "--output=json"}
	switch strings.ToLower(filepath.Ext(name)) {
	case ".qcow2":
		args = append(args, "-f", "qcow2")
	case ".raw":
		args = append(args, "-f", "raw")
	}
	args = append(args, p)
	out, err := runTool(ctx, qemuImg, args...)
	if err != nil {
		return ImageInfo{}, fmt.Errorf("disk image %s is not usable: %v: %w", name, err, errdefs.ErrInvalidArgument)
	}
	var info ImageInfo
	if err := json.Unmarshal(out, &info); err != nil {
		return ImageInfo{}, fmt.Errorf("disk image %s: cannot parse qemu-img output: %w", name, err)
	}
	switch {
	case info.Format != "qcow2" && info.Format != "raw":
		return ImageInfo{}, fmt.Errorf("disk image %s has format %q; only qcow2 and raw are supported: %w", name, info.Format, errdefs.ErrInvalidArgument)
	case info.BackingFile != "":
		return ImageInfo{}, fmt.Errorf("disk image %s has a backing file (%s); only self-contained images are supported: %w", name, info.BackingFile, errdefs.ErrInvalidArgument)
	case info.VirtualSize <= 0:
		return ImageInfo{}, fmt.Errorf("disk image %s is empty: %w", name, errdefs.ErrInvalidArgument)
	}
	return info, nil
}

// EnsureOverlay creates a qcow2 overlay at overlay on top of base, unless
// one is already there (a restarted container keeps its data). It reports
// whether it created the file.
func EnsureOverlay(ctx context.Context, qemuImg, base, baseFormat, overlay string) (bool, error) {
	if _, err := os.Stat(overlay); err == nil {
		return false, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("stat overlay %s: %w", overlay, err)
	}
	if _, err := runTool(ctx, qemuImg, "create", "-q", "-f", "qcow2", "-F", baseFormat, "-b", base, overlay); err != nil {
		_ = os.Remove(overlay)
		return false, fmt.Errorf("create overlay %s: %w", overlay, err)
	}
	return true, nil
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
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = err.Error()
		}
		return nil, errors.New(msg)
	}
	return stdout.Bytes(), nil
}
