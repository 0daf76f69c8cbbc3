package vm

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
)

// libvirtdPID reads the pid libvirtd wrote at start, "" when it is not
// running as a daemon here.
func libvirtdPID(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/var/run/libvirtd.pid")
	if err != nil {
		return ""
	}
	pid := strings.TrimSpace(string(b))
	if _, err := os.Stat("/proc/" + pid); err != nil {
		return ""
	}
	return pid
}

// openSockets counts this process's socket descriptors.
func openSockets(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(target, "socket:") {
			n++
		}
	}
	return n
}

// Shims come and go in bursts (a node drains, a density test removes its
// pods at once). libvirt 9.0.0 crashed when it handled a client's event
// deregistration and its close at the same time
// (remoteClientFreePrivateCallbacks: "unexpected incomplete domain
// callback", SIGSEGV in an rpc-libvirtd thread); a Conn subscribes to
// nothing, and bursts of them opening and closing leave libvirtd up.
func TestConnCloseBurstKeepsLibvirtd(t *testing.T) {
	if testing.Short() {
		t.Skip("talks to the host's libvirtd")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root for libvirtd's read-write socket")
	}
	pid := libvirtdPID(t)
	if pid == "" {
		t.Skip("libvirtd is not running (hack/setup-host.sh starts it)")
	}
	ctx := context.Background()

	// Other domains come and go the whole time, as they do while pods
	// do: a domain that needs no QEMU is defined and undefined in a loop.
	churn, err := Connect(ctx, DefaultSocket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = churn.Close() })
	go func() {
		for range churn.Events() {
		}
	}()
	spec := baseSpec()
	spec.Name = fmt.Sprintf("kvm-conntest-%d", os.Getpid())
	spec.UUID = fmt.Sprintf("6f1c2a4e-8d3b-5e7f-9a0b-%012x", os.Getpid())
	spec.Kernel = &Kernel{Path: "/nonexistent/vmlinuz"} // never started
	domainXML, err := Render(&spec)
	if err != nil {
		t.Fatal(err)
	}
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if defineErr := churn.Define(domainXML); defineErr != nil {
				t.Error(defineErr)
				return
			}
			if undefineErr := churn.Undefine(spec.Name); undefineErr != nil {
				t.Error(undefineErr)
				return
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		<-stopped
		_ = churn.Undefine(spec.Name)
	})

	// Sockets that earlier tests left to the garbage collector may close
	// meanwhile; a connection Close left open adds one.
	socks := openSockets(t)
	const rounds, conns = 25, 12
	for r := 0; r < rounds; r++ {
		var wg sync.WaitGroup
		errs := make(chan error, conns)
		for i := 0; i < conns; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, connectErr := Connect(ctx, DefaultSocket)
				if connectErr != nil {
					errs <- connectErr
					return
				}
				if _, versionErr := c.Version(); versionErr != nil {
					errs <- versionErr
				}
				if closeErr := c.Close(); closeErr != nil {
					errs <- closeErr
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: %v", r, err)
		}
		if got := libvirtdPID(t); got != pid {
			t.Fatalf("round %d: libvirtd (pid %s) is gone, now %q: it crashed while connections closed", r, pid, got)
		}
	}
	if got := openSockets(t); got > socks {
		t.Errorf("%d sockets open before the bursts, %d after: closed connections left sockets open", socks, got)
	}
	c, err := Connect(ctx, DefaultSocket)
	if err != nil {
		t.Fatalf("libvirtd does not answer after the bursts: %v", err)
	}
	defer c.Close()
	if _, err := c.Version(); err != nil {
		t.Fatalf("libvirtd does not answer after the bursts: %v", err)
	}
}
