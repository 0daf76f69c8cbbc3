package shim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// A stdin that cannot be opened after stdout was: an error, and the
// stdout FIFO closed again.
func TestOpenStdioClosesStdoutOnStdinError(t *testing.T) {
	dir := t.TempDir()
	stdout := filepath.Join(dir, "stdout")
	if err := syscall.Mkfifo(stdout, 0o600); err != nil {
		t.Fatal(err)
	}
	before := countFDs(t)
	in, out, err := openStdio(context.Background(), stdio{Stdout: stdout, Stdin: filepath.Join(dir, "missing")}, "vm1", "default")
	if err == nil || !strings.Contains(err.Error(), "open stdin") || in != nil || out != nil {
		t.Fatalf("got %v, %v, %v; want an error about stdin", in, out, err)
	}
	if after := countFDs(t); after > before { // others may close meanwhile, none opens
		t.Errorf("%d descriptors open before, %d after", before, after)
	}
}

func countFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// writeLogger writes a logging binary (a shell script) that records its
// pid and environment, signals readiness by closing fd 5 and copies the
// container's stdout (fd 3) to out until EOF.
func writeLogger(t *testing.T, dir string) (bin, out, pidFile string) {
	t.Helper()
	bin, out, pidFile = filepath.Join(dir, "logger"), filepath.Join(dir, "log"), filepath.Join(dir, "logger.pid")
	// Its arguments: "a" LOG "b" PIDFILE (the URI's query, in key order).
	script := "#!/bin/sh\necho $$ > \"$4\"\necho \"$CONTAINER_NAMESPACE/$CONTAINER_ID\" > \"$2\"\nexec 5>&-\nexec /bin/cat <&3 >> \"$2\"\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin, out, pidFile
}

// The VM's console reaches a binary:// logger (as nerdctl gives every
// detached container), and the logger is ended and reaped with the task.
func TestVMTaskConsoleToLoggingBinary(t *testing.T) {
	f := newVMFixture(t)
	dir := t.TempDir()
	bin, out, pidFile := writeLogger(t, dir)
	uri := "binary://" + bin + "?a=" + out + "&b=" + pidFile
	f.stdio = stdio{Stdout: uri, Stderr: uri}
	vt := f.created()
	before := countFDs(t)
	if _, err := vt.start(context.Background()); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("the logger never ran: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, _ := os.ReadFile(out)
		if strings.Contains(string(b), "KVM-GUEST-READY") {
			if !strings.HasPrefix(string(b), "default/vm1\n") {
				t.Errorf("logger saw namespace/id %q", strings.SplitN(string(b), "\n", 2)[0])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the console never reached the logger: %q", b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	f.fake.stop(vt.rec.Domain, vm.StopDestroyed)
	vt.onStopped(context.Background(), vm.StopDestroyed)
	if err := vt.delete(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Wait4(pid, nil, unix.WNOHANG, nil); !errors.Is(err, unix.ECHILD) {
		t.Errorf("logger pid %d not reaped after delete: wait4 says %v", pid, err)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("logger pid %d still there after delete", pid)
	}
	if after := countFDs(t); after > before {
		t.Errorf("%d descriptors open before the start, %d after the delete", before, after)
	}
}

// A binary:// URI whose binary is missing is refused before anything is
// made, naming the binary.
func TestCreateVMTaskMissingLoggerLeavesNothing(t *testing.T) {
	f := newVMFixture(t)
	f.kernelRootfs()
	uri := "binary:///nonexistent/logger?x=1"
	f.stdio = stdio{Stdout: uri, Stderr: uri}
	_, err := f.create(nil)
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "logging binary /nonexistent/logger does not exist") {
		t.Fatalf("got %v", err)
	}
	if calls := f.fake.called(); len(calls) != 0 {
		t.Errorf("libvirt was called: %v", calls)
	}
	assertGone(t, filepath.Join(f.bundle, recordFile))
	if left, _ := filepath.Glob(filepath.Join(f.host.cfg.StateDir, "vms", "*")); len(left) > 0 {
		t.Errorf("left in state dir: %v", left)
	}
}
