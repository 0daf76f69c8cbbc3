package vm

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// BindDirReadOnly bind-mounts the host directory src read-only onto
// target (created). Changes made under src, such as kubelet's atomic
// swap of a configMap's ..data link, show through.
func BindDirReadOnly(src, target string) (retErr error) {
	if err := os.MkdirAll(target, 0o700); err != nil {
		return fmt.Errorf("create mount point %s: %w", target, err)
	}
	defer func() {
		if retErr != nil {
			_ = Unmount(target)
		}
	}()
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mount %s on %s: %w", src, target, err)
	}
	if err := unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("make %s read-only: %w", target, err)
	}
	return nil
}

// SupportsDirectIO reports whether p's file system takes O_DIRECT (tmpfs
// does not), which a disk with cache='none' needs.
func SupportsDirectIO(p string) (bool, error) {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.EINVAL) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("open %s: %w", p, err)
	}
	unix.Close(fd)
	return true, nil
}
