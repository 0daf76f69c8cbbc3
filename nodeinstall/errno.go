package nodeinstall

import "golang.org/x/sys/unix"

var (
	errNotEmpty error = unix.ENOTEMPTY
	errExist    error = unix.EEXIST
)
