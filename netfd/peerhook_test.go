package netfd

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// The peer hook sees the authorized wrapper's pid before the descriptors
// leave, and its error keeps them: the shim moves QEMU into the pod's
// cgroup there, and a failed move must not start the VM.
func TestHandoffPeerHook(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown the socket")
	}
	dir := filepath.Join(t.TempDir(), "netfd")
	pidDir := t.TempDir()
	pidFile := filepath.Join(pidDir, "dom1.pid")
	var provided, seen atomic.Int32
	var fail atomic.Bool
	provide := func() (Grant, []NICFiles, error) {
		provided.Add(1)
		f, err := os.CreateTemp(t.TempDir(), "q")
		g := Grant{NICs: []NIC{{NetdevID: "kvmnet0", MAC: "02:00:00:00:00:01", Bus: "pcie.0", Addr: "0x10"}}}
		return g, []NICFiles{{TAP: []*os.File{f}}}, err
	}
	hook := func(pid int) error {
		b, err := os.ReadFile(pidFile)
		if err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(pid) {
			t.Errorf("hook got pid %d, the pid file says %q (%v)", pid, b, err)
		}
		seen.Add(1)
		if fail.Load() {
			return errors.New("no cgroup")
		}
		return nil
	}
	s, err := ServerConfig{Dir: dir, Domain: "dom1", PIDDir: pidDir, Provide: provide}.Serve(context.Background(), WithPeerHook(hook))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := runFetchChild(t, SocketPath(dir, "dom1"), "guest=dom1", pidFile); !strings.HasPrefix(got, "FETCH-OK") {
		t.Fatalf("with a hook that agrees: %s", got)
	}
	if seen.Load() != 1 || provided.Load() != 1 {
		t.Errorf("hook ran %d times, provider %d times; want once each", seen.Load(), provided.Load())
	}
	// A peer that is refused never reaches the hook.
	if got := runFetchChild(t, SocketPath(dir, "dom1"), "guest=dom2", pidFile); !strings.HasPrefix(got, "FETCH-ERROR") || seen.Load() != 1 {
		t.Errorf("another domain's process: %s; hook ran %d times", got, seen.Load())
	}
	fail.Store(true)
	if got := runFetchChild(t, SocketPath(dir, "dom1"), "guest=dom1", pidFile); !strings.HasPrefix(got, "FETCH-ERROR") ||
		provided.Load() != 1 {
		t.Errorf("hook refusing: %s; provider ran %d times, want no descriptors opened", got, provided.Load())
	}
}
