package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
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

// A libvirtd that accepts but never answers holds Connect no longer than
// its context's deadline, which here is far shorter than the 5 s the dial
// was once fixed at; the socket it opened is closed, not leaked.
func TestConnectHonoursDeadline(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "libvirt-sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, acceptErr := l.Accept()
		if acceptErr != nil {
			return
		}
		accepted <- c // held open, never answered
	}()

	const deadline = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	conn, err := Connect(ctx, sock)
	took := time.Since(start)
	if err == nil {
		conn.Close()
		t.Fatal("connected to a libvirtd that never answers")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v does not say the deadline passed", err)
	}
	if took < deadline || took > deadline+time.Second {
		t.Errorf("Connect returned after %v, deadline %v", took, deadline)
	}

	var server net.Conn
	select {
	case server = <-accepted:
	case <-time.After(time.Second):
		t.Fatal("Connect never reached the listener")
	}
	defer server.Close()
	_ = server.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 4096)
	for {
		// The handshake's request arrives, then EOF: the client closed
		// its socket when the deadline passed.
		if _, err := server.Read(buf); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Errorf("client socket still open after Connect failed: %v", err)
			}
			break
		}
	}
}

// A context that is already over fails Connect before any dial.
func TestConnectCanceledContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Connect(ctx, filepath.Join(t.TempDir(), "none")); !errors.Is(err, context.Canceled) {
		t.Fatalf("Connect with a canceled context: %v", err)
	}
}

// The context bounds only the connecting: a connection made keeps
// working after its context ends.
func TestConnectOutlivesItsContext(t *testing.T) {
	if testing.Short() {
		t.Skip("talks to the host's libvirtd")
	}
	if os.Geteuid() != 0 || libvirtdPID(t) == "" {
		t.Skip("needs root and a running libvirtd (hack/setup-host.sh starts it)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	conn, err := Connect(ctx, DefaultSocket)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	defer conn.Close()
	go func() {
		for range conn.Events() {
		}
	}()
	cancel()
	time.Sleep(100 * time.Millisecond)
	if _, err := conn.Version(); err != nil {
		t.Fatalf("connection ended with its context: %v", err)
	}
	if n := conn.Reconnects(); n != 0 {
		t.Fatalf("connection was lost and made again %d times", n)
	}
}
