package netfd

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// VhostNetPath is the vhost-net device.
const VhostNetPath = "/dev/vhost-net"

// OpenVhost opens one /dev/vhost-net descriptor per queue.
func OpenVhost(n int) ([]*os.File, error) {
	var files []*os.File
	for i := 0; i < n; i++ {
		fd, err := unix.Open(VhostNetPath, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			closeFiles(files)
			return nil, fmt.Errorf("open %s: %w", VhostNetPath, err)
		}
		files = append(files, os.NewFile(uintptr(fd), VhostNetPath))
	}
	return files, nil
}

// VhostAvailable says whether vhost-net can be used, and if not, why.
func VhostAvailable() (bool, string) {
	fd, err := unix.Open(VhostNetPath, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Sprintf("%s: %v", VhostNetPath, err)
	}
	unix.Close(fd)
	return true, ""
}
