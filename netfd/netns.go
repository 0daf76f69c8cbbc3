package netfd

import (
	"errors"
	"fmt"
	"io/fs"
	"runtime"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// inNetns runs fn on an OS thread that has joined the network namespace
// at path. If the thread cannot return to its original namespace it stays
// locked, so the Go runtime retires it instead of reusing it elsewhere.
func inNetns(path string, fn func(h *netlink.Handle) error) error {
	target, err := openNetns(path)
	if err != nil {
		return err
	}
	defer target.Close()

	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		origin, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("get current network namespace: %w", err)
			return
		}
		defer origin.Close()
		if err = netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter network namespace %s: %w", path, err)
			return
		}
		h, err := netlink.NewHandle()
		if err == nil {
			err = fn(h)
			h.Close()
		} else {
			err = fmt.Errorf("netlink in %s: %w", path, err)
		}
		if rerr := netns.Set(origin); rerr != nil {
			// Leave the thread locked: it exits with this goroutine.
			errc <- errors.Join(err, fmt.Errorf("return to host network namespace: %w", rerr))
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

func openNetns(path string) (netns.NsHandle, error) {
	if path == "" {
		return 0, fmt.Errorf("the pod has no network namespace (host network pods get no VM network): %w", errdefs.ErrInvalidArgument)
	}
	ns, err := netns.GetFromPath(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("pod network namespace %s does not exist: %w", path, errdefs.ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("open pod network namespace %s: %w", path, err)
	}
	return ns, nil
}
