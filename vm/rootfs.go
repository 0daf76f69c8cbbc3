package vm

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/containerd/errdefs"
	securejoin "github.com/cyphar/filepath-securejoin"
	"github.com/cyphar/filepath-securejoin/pathrs-lite"
)

// Where a container image keeps what the VM boots from: the KubeVirt
// containerDisk layout, or a kernel for direct boot.
const (
	DiskDir = "/disk"
	BootDir = "/boot"
)

var diskExts = []string{".qcow2", ".img", ".raw"}

// BootSource is what a container rootfs offers to boot from, as paths
// inside the rootfs (absolute, as the container sees them).
type BootSource struct {
	Disk   string // e.g. /disk/guest.qcow2
	Kernel string // e.g. /boot/vmlinuz
	Initrd string // optional, with Kernel
}

// FindBootSource looks for exactly one disk image under /disk/, or else a
// kernel (and optional initrd) under /boot/. Every path is resolved inside
// rootfs; a symlink that leads outside it is an error.
func FindBootSource(rootfs string) (BootSource, error) {
	disks, err := listInRoot(rootfs, DiskDir, func(name string) bool {
		ext := strings.ToLower(filepath.Ext(name))
		for _, e := range diskExts {
			if ext == e {
				return true
			}
		}
		return false
	})
	if err != nil {
		return BootSource{}, err
	}
	switch len(disks) {
	case 0:
	case 1:
		return BootSource{Disk: disks[0]}, nil
	default:
		return BootSource{}, fmt.Errorf("more than one disk image under %s/: %s; a VM image must have exactly one *.qcow2, *.img or *.raw: %w",
			DiskDir, strings.Join(disks, ", "), errdefs.ErrInvalidArgument)
	}

	kernels, err := listInRoot(rootfs, BootDir, func(name string) bool { return strings.HasPrefix(name, "vmlinuz") })
	if err != nil {
		return BootSource{}, err
	}
	initrds, err := listInRoot(rootfs, BootDir, func(name string) bool { return strings.HasPrefix(name, "initrd") })
	if err != nil {
		return BootSource{}, err
	}
	switch {
	case len(kernels) == 0:
		return BootSource{}, fmt.Errorf("no VM image in the container rootfs: expected exactly one *.qcow2, *.img or *.raw file under %s/, or "+
			"a kernel %s/vmlinuz*; a container without one runs with runc only when plain_containers is enabled in the shim config: %w",
			DiskDir, BootDir, errdefs.ErrInvalidArgument)
	case len(kernels) > 1:
		return BootSource{}, fmt.Errorf("more than one kernel under %s/: %s: %w", BootDir, strings.Join(kernels, ", "),
			errdefs.ErrInvalidArgument)
	case len(initrds) > 1:
		return BootSource{}, fmt.Errorf("more than one initrd under %s/: %s: %w", BootDir, strings.Join(initrds, ", "),
			errdefs.ErrInvalidArgument)
	}
	src := BootSource{Kernel: kernels[0]}
	if len(initrds) == 1 {
		src.Initrd = initrds[0]
	}
	return src, nil
}

// listInRoot returns the container paths of the entries of dir (inside
// rootfs) whose names match. A missing dir is an empty list.
func listInRoot(rootfs, dir string, match func(string) bool) ([]string, error) {
	full, err := securejoin.SecureJoin(rootfs, dir)
	if err != nil {
		return nil, fmt.Errorf("resolve %s in the container rootfs: %w", dir, err)
	}
	entries, err := os.ReadDir(full)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s in the container rootfs: %w", dir, err)
	}
	var out []string
	for _, e := range entries {
		if match(e.Name()) {
			out = append(out, path.Join(dir, e.Name()))
		}
	}
	sort.Strings(out)
	return out, nil
}

// OpenInRootfs opens the regular file at the container path p for reading,
// resolving every symlink inside rootfs. A symlink chain that climbs out of
// the rootfs is reported as such rather than silently clamped.
func OpenInRootfs(rootfs, p string) (*os.File, error) {
	if err := checkNoEscape(rootfs, p); err != nil {
		return nil, err
	}
	h, err := pathrs.OpenInRoot(rootfs, p)
	if err != nil {
		return nil, fmt.Errorf("open %s in the container rootfs: %w", p, err)
	}
	defer h.Close()
	f, err := pathrs.Reopen(h, os.O_RDONLY)
	if err != nil {
		return nil, fmt.Errorf("open %s in the container rootfs: %w", p, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("stat %s in the container rootfs: %w", p, err)
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s in the container rootfs is not a regular file: %w", p, errdefs.ErrInvalidArgument)
	}
	return f, nil
}

// checkNoEscape follows p component by component as the container would see
// it (absolute link targets start again at the rootfs) and fails when ".."
// would leave the rootfs.
func checkNoEscape(rootfs, p string) error {
	var stack []string
	pending := strings.Split(strings.TrimPrefix(path.Clean("/"+p), "/"), "/")
	links := 0
	for len(pending) > 0 {
		c := pending[0]
		pending = pending[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(stack) == 0 {
				return fmt.Errorf("%s is a symlink that points outside the container rootfs: %w", p, errdefs.ErrInvalidArgument)
			}
			stack = stack[:len(stack)-1]
			continue
		}
		stack = append(stack, c)
		host := filepath.Join(append([]string{rootfs}, stack...)...)
		st, err := os.Lstat(host)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("%s does not exist in the container rootfs: %w", p, errdefs.ErrInvalidArgument)
			}
			return fmt.Errorf("resolve %s in the container rootfs: %w", p, err)
		}
		if st.Mode()&fs.ModeSymlink == 0 {
			continue
		}
		if links++; links > 40 {
			return fmt.Errorf("%s: too many levels of symlinks: %w", p, errdefs.ErrInvalidArgument)
		}
		target, err := os.Readlink(host)
		if err != nil {
			return fmt.Errorf("resolve %s in the container rootfs: %w", p, err)
		}
		stack = stack[:len(stack)-1]
		if path.IsAbs(target) {
			stack = nil
		}
		pending = append(strings.Split(target, "/"), pending...)
	}
	return nil
}
