package netfd

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestFetchChild is the wrapper's side, run in a child process whose
// command line names a domain (see runFetchChild).
func TestFetchChild(t *testing.T) {
	sock := os.Getenv("KVMSHIM_FETCH_SOCK")
	if sock == "" {
		t.Skip("helper for TestHandoff")
	}
	g, tap, vhost, err := Fetch(sock)
	if err != nil {
		fmt.Printf("FETCH-ERROR %v\n", err)
		return
	}
	inheritable := true
	for _, fd := range append(tap, vhost...) {
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		inheritable = inheritable && err == nil && flags&unix.FD_CLOEXEC == 0
	}
	b, _ := json.Marshal(map[string]any{"grant": g, "tap": len(tap), "vhost": len(vhost), "inheritable": inheritable})
	fmt.Printf("FETCH-OK %s\n", b)
}

func runFetchChild(t *testing.T, sock, nameArg string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestFetchChild$", "-test.v", "--", "-name", nameArg)
	cmd.Env = append(os.Environ(), "KVMSHIM_FETCH_SOCK="+sock)
	out, _ := cmd.CombinedOutput()
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "FETCH-") {
			return line
		}
	}
	t.Fatalf("child printed no result:\n%s", out)
	return ""
}

func TestHandoff(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown the socket")
	}
	dir := filepath.Join(t.TempDir(), "netfd")
	provide := func() (Grant, []*os.File, []*os.File, error) {
		var tap []*os.File
		for i := 0; i < 2; i++ {
			f, err := os.CreateTemp(t.TempDir(), "q")
			if err != nil {
				return Grant{}, nil, nil, err
			}
			tap = append(tap, f)
		}
		return Grant{NetdevID: "kvmnet0", MAC: "02:00:00:00:00:01", Bus: "pcie.0", Addr: "0x10"}, tap, nil, nil
	}
	s, err := Serve(context.Background(), dir, "dom1", 0, 0, t.TempDir(), provide)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	st, err := os.Stat(dir)
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("socket dir mode %v, %v", st.Mode(), err)
	}

	got := runFetchChild(t, SocketPath(dir, "dom1"), "guest=dom1,debug-threads=on")
	if !strings.HasPrefix(got, "FETCH-OK") || !strings.Contains(got, `"tap":2`) || !strings.Contains(got, `"inheritable":true`) {
		t.Errorf("the VM's own wrapper: %s", got)
	}
	// Another VM's process (same QEMU user) gets nothing.
	if got := runFetchChild(t, SocketPath(dir, "dom1"), "guest=dom2,debug-threads=on"); !strings.HasPrefix(got, "FETCH-ERROR") {
		t.Errorf("a process naming another domain: %s", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(SocketPath(dir, "dom1")); err == nil {
		t.Error("socket left after Close")
	}

	// A peer that is not the QEMU user gets nothing either.
	s2, err := Serve(context.Background(), dir, "dom1", 64055, 64055, t.TempDir(), provide)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if got := runFetchChild(t, SocketPath(dir, "dom1"), "guest=dom1"); !strings.HasPrefix(got, "FETCH-ERROR") {
		t.Errorf("a peer of another uid: %s", got)
	}
}

func TestHandoffChecksLibvirtPid(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown the socket")
	}
	pidDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(pidDir, "dom1.pid"), []byte("1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "netfd")
	s, err := Serve(context.Background(), dir, "dom1", 0, 0, pidDir, func() (Grant, []*os.File, []*os.File, error) {
		t.Error("descriptors provided to a process libvirt did not start")
		return Grant{}, nil, nil, fmt.Errorf("no")
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := runFetchChild(t, SocketPath(dir, "dom1"), "guest=dom1"); !strings.HasPrefix(got, "FETCH-ERROR") {
		t.Errorf("got %s", got)
	}
}
