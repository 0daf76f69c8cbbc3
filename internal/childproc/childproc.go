// Package childproc starts and waits for the helper processes of the shim
// (qemu-img, mkfs.vfat, logging binaries) whether or not the shim reaps
// its children itself: once a reaper collects every exit (as it must for
// runc containers, whose processes the shim adopts as a subreaper), a
// plain exec.Cmd.Wait would lose the race for the exit status.
package childproc

import (
	"fmt"
	"os/exec"
	"sync"
)

// Reaper starts a command whose exit it collects; the returned wait
// blocks until the command ended and returns its exit status.
type Reaper interface {
	Start(cmd *exec.Cmd) (wait func() (int, error), err error)
}

var (
	mu     sync.Mutex
	reaper Reaper // guarded by mu; nil: exec.Cmd waits for its own child
)

// SetReaper makes every later Start go through r. It is set once, before
// the shim starts any child that r's reaping could collect.
func SetReaper(r Reaper) {
	mu.Lock()
	defer mu.Unlock()
	reaper = r
}

func current() Reaper {
	mu.Lock()
	defer mu.Unlock()
	return reaper
}

// ExitError is a command's non-zero exit status as a reaper reported it.
type ExitError struct {
	Path   string
	Status int
}

func (e *ExitError) Error() string {
	return fmt.Sprintf("%s: exit status %d", e.Path, e.Status)
}

// Start starts cmd; the returned wait is cmd.Wait, or with a reaper the
// wait for the exit it collected (the command's output is copied out
// before it returns, as cmd.Wait does).
func Start(cmd *exec.Cmd) (wait func() error, err error) {
	r := current()
	if r == nil {
		if err = cmd.Start(); err != nil {
			return nil, err
		}
		return cmd.Wait, nil
	}
	w, err := r.Start(cmd)
	if err != nil {
		return nil, err
	}
	return func() error {
		status, err := w()
		if err != nil {
			return err
		}
		if status != 0 {
			return &ExitError{Path: cmd.Path, Status: status}
		}
		return nil
	}, nil
}

// Run starts cmd and waits for it.
func Run(cmd *exec.Cmd) error {
	wait, err := Start(cmd)
	if err != nil {
		return err
	}
	return wait()
}
