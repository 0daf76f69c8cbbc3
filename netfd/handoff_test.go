package netfd

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
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
	if pidFile := os.Getenv("KVMSHIM_FETCH_PIDFILE"); pidFile != "" {
		// as libvirt does before the QEMU it forked execs
		if err := os.WriteFile(pidFile, []byte(fmt.Sprintf("%d\n", os.Getpid())), 0o600); err != nil {
			fmt.Printf("FETCH-ERROR write pid file: %v\n", err)
			return
		}
	}
	g, fds, err := Fetch(sock)
	if err != nil {
		fmt.Printf("FETCH-ERROR %v\n", err)
		return
	}
	inheritable := true
	for _, fd := range fds {
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		inheritable = inheritable && err == nil && flags&unix.FD_CLOEXEC == 0
	}
	b, _ := json.Marshal(map[string]any{"grant": g, "fds": len(fds), "inheritable": inheritable, "nics": len(g.NICs),
		"args": strings.Join(g.QEMUArgs(fds), " ")})
	fmt.Printf("FETCH-OK %s\n", b)
}

// runFetchChild runs the wrapper's side with nameArg on its command line;
// with pidFile, the child first writes its pid there, as libvirt would.
func runFetchChild(t *testing.T, sock, nameArg, pidFile string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestFetchChild$", "-test.v", "--", "-name", nameArg)
	cmd.Env = append(os.Environ(), "KVMSHIM_FETCH_SOCK="+sock, "KVMSHIM_FETCH_PIDFILE="+pidFile)
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
	// Two NICs: eth0 with two queues, net1 with one.
	provide := func() (Grant, []NICFiles, error) {
		var files []NICFiles
		for _, queues := range []int{2, 1} {
			var tap []*os.File
			for i := 0; i < queues; i++ {
				f, err := os.CreateTemp(t.TempDir(), "q")
				if err != nil {
					return Grant{}, nil, err
				}
				tap = append(tap, f)
			}
			files = append(files, NICFiles{TAP: tap})
		}
		return Grant{NICs: []NIC{
			{NetdevID: "kvmnet0", MAC: "02:00:00:00:00:01", Bus: "pcie.0", Addr: "0x10"},
			{NetdevID: "kvmnet1", MAC: "02:00:00:00:00:02", Bus: "pcie.0", Addr: "0x11"},
		}}, files, nil
	}
	pidDir := t.TempDir()
	pidFile := filepath.Join(pidDir, "dom1.pid")
	s, err := ServerConfig{Dir: dir, Domain: "dom1", PIDDir: pidDir, Provide: provide}.Serve(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// The QEMU user reaches its socket but cannot replace another's.
	st, err := os.Stat(dir)
	if err != nil || st.Mode().Perm() != 0o711 || st.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("socket dir %v owned by %d, %v; want root's, 0711", st.Mode(), st.Sys().(*syscall.Stat_t).Uid, err)
	}

	got := runFetchChild(t, SocketPath(dir, "dom1"), "guest=dom1,debug-threads=on", pidFile)
	if !strings.HasPrefix(got, "FETCH-OK") || !strings.Contains(got, `"fds":3`) || !strings.Contains(got, `"nics":2`) ||
		!strings.Contains(got, `"inheritable":true`) ||
		!regexp.MustCompile(`-netdev tap,id=kvmnet0,fds=\d+:\d+ `+
			`-device virtio-net-pci,netdev=kvmnet0,id=kvmnet0-dev,mac=02:00:00:00:00:01,bus=pcie.0,addr=0x10,mq=on,vectors=6 `+
			`-netdev tap,id=kvmnet1,fds=\d+ `+
			`-device virtio-net-pci,netdev=kvmnet1,id=kvmnet1-dev,mac=02:00:00:00:00:02,bus=pcie.0,addr=0x11"`).MatchString(got) {
		t.Errorf("the VM's own wrapper: %s", got)
	}
	// Another VM's process (same QEMU user) gets nothing.
	if got := runFetchChild(t, SocketPath(dir, "dom1"), "guest=dom2,debug-threads=on", pidFile); !strings.HasPrefix(got, "FETCH-ERROR") {
		t.Errorf("a process naming another domain: %s", got)
	}
	if err = s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err = os.Stat(SocketPath(dir, "dom1")); err == nil {
		t.Error("socket left after Close")
	}

	// A peer that is not the QEMU user gets nothing either.
	c2 := ServerConfig{Dir: dir, Domain: "dom1", QEMUUID: 64055, QEMUGID: 64055, PIDDir: pidDir, Provide: provide}
	s2, err := c2.Serve(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if got := runFetchChild(t, SocketPath(dir, "dom1"), "guest=dom1", pidFile); !strings.HasPrefix(got, "FETCH-ERROR") {
		t.Errorf("a peer of another uid: %s", got)
	}
}

// Only the process libvirt started for the domain gets its descriptors:
// not one whose pid differs from the domain's pid file, and none while
// there is no pid file (before the start, or after the VM stopped while
// the socket still serves), although any process may name the domain on
// its command line.
func TestHandoffChecksLibvirtPid(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown the socket")
	}
	for name, pidFile := range map[string]string{"another pid": "1\n", "no pid file": ""} {
		t.Run(name, func(t *testing.T) {
			pidDir := t.TempDir()
			if pidFile != "" {
				if err := os.WriteFile(filepath.Join(pidDir, "dom1.pid"), []byte(pidFile), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			dir := filepath.Join(t.TempDir(), "netfd")
			s, err := ServerConfig{Dir: dir, Domain: "dom1", PIDDir: pidDir, Provide: func() (Grant, []NICFiles, error) {
				t.Error("descriptors provided to a process libvirt did not start")
				return Grant{}, nil, fmt.Errorf("no")
			}}.Serve(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if got := runFetchChild(t, SocketPath(dir, "dom1"), "guest=dom1", ""); !strings.HasPrefix(got, "FETCH-ERROR") {
				t.Errorf("got %s", got)
			}
		})
	}
}

// TestServeChild listens where KVMSHIM_SERVE_SOCK says and accepts one
// connection: a server that is not the shim (see TestFetchRefusesNonRoot).
func TestServeChild(t *testing.T) {
	sock := os.Getenv("KVMSHIM_SERVE_SOCK")
	if sock == "" {
		t.Skip("helper for TestFetchRefusesNonRoot")
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		fmt.Printf("SERVE-ERROR %v\n", err)
		return
	}
	fmt.Println("SERVE-READY")
	c, err := l.Accept()
	if err == nil {
		c.Close()
	}
}

// A socket put in the domain's place by anyone but root (another VM's
// QEMU, say) gets no hearing from the wrapper.
func TestFetchRefusesNonRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a server as another user")
	}
	dir := t.TempDir() // the child, as uid 65534, runs a copy of this test binary from here
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "netfd.test")
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err = os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "dom1.sock")
	cmd := exec.Command(bin, "-test.run=^TestServeChild$", "-test.v")
	cmd.Env = append(os.Environ(), "KVMSHIM_SERVE_SOCK="+sock)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err = cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	r := bufio.NewReader(out)
	line, err := r.ReadString('\n')
	for err == nil && !strings.HasPrefix(line, "SERVE-") { // go test's own lines first
		line, err = r.ReadString('\n')
	}
	if !strings.HasPrefix(line, "SERVE-READY") {
		t.Fatalf("server as uid 65534: %q %v", line, err)
	}
	_, _, err = Fetch(sock)
	if err == nil || !strings.Contains(err.Error(), "uid 65534, not root") {
		t.Errorf("Fetch from a server of uid 65534: %v", err)
	}
}
