package vm

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// ExitWatch tells when one domain's QEMU process ends.
//
// The shim learns that its VM stopped from its own QEMU's pidfd, not from
// libvirt's lifecycle events: go-libvirt registers those for every domain
// on the host (its LifecycleEvents and SubscribeEvents pass no domain to
// ConnectDomainEventCallbackRegisterAny, and the routing of a callback it
// did not register is unexported), so each shim would get the events of
// every VM on the node, N shims × N VMs. A pidfd wakes one shim, once,
// when its own QEMU is gone; libvirtd, which reaps QEMU, then has the
// domain's state and its reason.
type ExitWatch struct {
	exited chan struct{} // closed when the process is gone
	closed chan struct{} // closed by Close
	once   sync.Once
	f      *os.File // the pidfd; nil when the process was gone already
}

// WatchExit watches process pid, which libvirt's pid file names as the
// QEMU of domain name. The pid is trusted only once a pidfd pins the
// process and its command line names the domain (libvirt passes
// "-name guest=<name>,..."): a pid reused after QEMU ended counts as
// QEMU's exit, as does a process already gone.
func WatchExit(name string, pid int) (*ExitWatch, error) {
	w := &ExitWatch{exited: make(chan struct{}), closed: make(chan struct{})}
	// No PIDFD_NONBLOCK (Linux 5.10): a pidfd is pollable from 5.3,
	// and O_NONBLOCK set afterwards is what Go's poller looks for.
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		close(w.exited)
		return w, nil
	}
	if err == nil {
		if err = unix.SetNonblock(fd, true); err != nil {
			_ = unix.Close(fd)
		}
	}
	if err != nil {
		var class error = errdefs.ErrUnavailable
		if errors.Is(err, unix.ENOSYS) {
			class = errdefs.ErrNotImplemented
		}
		return nil, fmt.Errorf("watch QEMU of domain %s (pid %d) (a pidfd needs Linux 5.3): %v: %w", name, pid, err, class)
	}
	// A non-blocking descriptor joins Go's poller: waiting for the exit
	// holds no thread.
	w.f = os.NewFile(uintptr(fd), "pidfd:"+strconv.Itoa(pid))
	if !isQEMUOf(pid, name) {
		_ = w.f.Close()
		w.f = nil
		close(w.exited)
		return w, nil
	}
	go w.wait()
	return w, nil
}

// WatchExit watches the QEMU of domain name, process pid (see the
// function WatchExit). It is Conn's so that a fake of Conn can drive exits.
func (c *Conn) WatchExit(name string, pid int) (*ExitWatch, error) {
	return WatchExit(name, pid)
}

// ExitWhen is a watch that reports an exit when ch closes: for fakes of
// Conn.
func ExitWhen(ch <-chan struct{}) *ExitWatch {
	w := &ExitWatch{exited: make(chan struct{}), closed: make(chan struct{})}
	go func() {
		select {
		case <-ch:
			close(w.exited)
		case <-w.closed:
		}
	}()
	return w
}

// isQEMUOf tells whether process pid's command line names domain name.
func isQEMUOf(pid int, name string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	want := []byte("guest=" + name)
	args := bytes.Split(b, []byte{0})
	for i := 0; i+1 < len(args); i++ {
		if string(args[i]) != "-name" {
			continue
		}
		v := args[i+1]
		if bytes.Equal(v, want) || bytes.HasPrefix(v, append(want, ',')) {
			return true
		}
	}
	return false
}

// wait blocks until the pidfd is readable, which it becomes when the
// process has ended, or until Close.
func (w *ExitWatch) wait() {
	rc, err := w.f.SyscallConn()
	if err == nil {
		err = rc.Read(func(fd uintptr) bool { return pidfdReadable(int(fd), 0) })
	}
	// An error other than Close's: the descriptor did not join the
	// poller. Wait in poll(2) with a timeout, so that Close still ends
	// the wait.
	for err != nil {
		select {
		case <-w.closed:
			return
		default:
		}
		if pidfdReadable(int(w.f.Fd()), 500) {
			err = nil
		}
	}
	close(w.exited)
}

// pidfdReadable polls a pidfd for up to timeoutMs milliseconds. An error
// other than EINTR counts as readable: the caller then asks libvirt.
func pidfdReadable(fd, timeoutMs int) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(p, timeoutMs)
	if errors.Is(err, unix.EINTR) {
		return false
	}
	return err != nil || n > 0
}

// Exited is closed when the process has ended. It never closes after
// Close.
func (w *ExitWatch) Exited() <-chan struct{} { return w.exited }

// Closed is closed by Close.
func (w *ExitWatch) Closed() <-chan struct{} { return w.closed }

// Close ends the watch and releases its descriptor.
func (w *ExitWatch) Close() {
	w.once.Do(func() {
		close(w.closed)
		if w.f != nil {
			_ = w.f.Close()
		}
	})
}
