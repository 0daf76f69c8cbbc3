package shim

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

func TestServeEnv(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want []string
	}{
		{[]string{"PATH=/bin"}, []string{"PATH=/bin", "GOMAXPROCS=2", "GODEBUG=memprofilerate=0"}},
		{[]string{"GODEBUG=gctrace=1", "A=b"}, []string{"A=b", "GOMAXPROCS=2", "GODEBUG=gctrace=1,memprofilerate=0"}},
		{[]string{"GODEBUG=memprofilerate=1"}, []string{"GOMAXPROCS=2", "GODEBUG=memprofilerate=1"}},
	} {
		if got := serveEnv(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("serveEnv(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// The cleanup after a shim crash waits for a libvirtd that is restarting
// (its socket missing for a moment) instead of giving up at once.
func TestConnectForCleanupWaitsForLibvirtd(t *testing.T) {
	if _, err := os.Stat(vm.DefaultSocket); err != nil || os.Geteuid() != 0 {
		t.Skip("needs root and a running libvirtd (hack/setup-host.sh starts it)")
	}
	sock := filepath.Join(t.TempDir(), "libvirt-sock")
	go func() {
		time.Sleep(500 * time.Millisecond)
		_ = os.Symlink(vm.DefaultSocket, sock) // libvirtd is back
	}()
	conn, err := connectForCleanup(context.Background(), sock)
	if err != nil {
		t.Fatalf("libvirtd back after 0.5 s: %v", err)
	}
	conn.Close()

	start := time.Now()
	if _, err := connectForCleanup(context.Background(), filepath.Join(t.TempDir(), "none")); err == nil {
		t.Fatal("connected to a socket that does not exist")
	}
	if took := time.Since(start); took > cleanupConnectBudget+time.Second {
		t.Errorf("gave up after %v, budget %v", took, cleanupConnectBudget)
	}
}

// A libvirtd that accepts but never answers holds the cleanup no longer
// than the budget.
func TestConnectForCleanupGivesUpOnHangingLibvirtd(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "libvirt-sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never answered
		}
	}()
	start := time.Now()
	if _, err := connectForCleanup(context.Background(), sock); err == nil {
		t.Fatal("connected to a libvirtd that never answers")
	}
	if took := time.Since(start); took > cleanupConnectBudget+time.Second {
		t.Errorf("gave up after %v, budget %v", took, cleanupConnectBudget)
	}
}

func TestRemoveDeadShimSocket(t *testing.T) {
	dir := t.TempDir()
	dead, live := filepath.Join(dir, "dead.sock"), filepath.Join(dir, "live.sock")
	for _, p := range []string{dead, live} {
		l, err := net.Listen("unix", p)
		if err != nil {
			t.Fatal(err)
		}
		if p == dead {
			l.(*net.UnixListener).SetUnlinkOnClose(false)
			l.Close()
		} else {
			defer l.Close()
		}
	}
	for _, sock := range []string{dead, live} {
		bundle := t.TempDir()
		if err := os.WriteFile(filepath.Join(bundle, "address"), []byte("unix://"+sock), 0o600); err != nil {
			t.Fatal(err)
		}
		removeDeadShimSocket(context.Background(), bundle)
	}
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("socket of a dead shim: %v, want it removed", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("socket of a live shim: %v, want it kept", err)
	}
	removeDeadShimSocket(context.Background(), t.TempDir()) // no address file: nothing to do
}
