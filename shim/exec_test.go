package shim

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/errdefs"
	"github.com/containerd/fifo"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kvm-shim/containerd-shim-kvm-v1/taskio"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm/vmtest"
)

func processSpec(t *testing.T, args ...string) *anypb.Any {
	t.Helper()
	b, err := json.Marshal(specs.Process{Args: args, Env: []string{"PATH=/bin"}, Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	return &anypb.Any{TypeUrl: "types.containerd.io/opencontainers/runtime-spec/1/Process", Value: b}
}

// execStdio makes an exec's FIFOs as containerd does and reads its output
// as containerd does; write feeds stdin when withStdin.
type execStdio struct {
	stdio
	stdout, stderr chan string
	stdin          io.WriteCloser
}

func newExecStdio(t *testing.T, withStdin bool) *execStdio {
	t.Helper()
	dir := t.TempDir()
	s := &execStdio{stdout: make(chan string, 1), stderr: make(chan string, 1)}
	s.Stdout, s.Stderr = filepath.Join(dir, "out"), filepath.Join(dir, "err")
	ctx := context.Background()
	for p, ch := range map[string]chan string{s.Stdout: s.stdout, s.Stderr: s.stderr} {
		r, err := fifo.OpenFifo(ctx, p, syscall.O_RDONLY|syscall.O_CREAT|syscall.O_NONBLOCK, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			b, _ := io.ReadAll(r)
			r.Close()
			ch <- string(b)
		}()
	}
	if withStdin {
		s.Stdin = filepath.Join(dir, "in")
		w, err := fifo.OpenFifo(ctx, s.Stdin, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_NONBLOCK, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		s.stdin = w
	}
	return s
}

func (s *execStdio) output(t *testing.T) (string, string) {
	t.Helper()
	var out, errOut string
	for i, ch := range []chan string{s.stdout, s.stderr} {
		select {
		case v := <-ch:
			if i == 0 {
				out = v
			} else {
				errOut = v
			}
		case <-time.After(5 * time.Second):
			t.Fatal("exec output never closed")
		}
	}
	return out, errOut
}

func waitExec(t *testing.T, e *execProcess) uint32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, _, err := e.wait(ctx)
	if err != nil {
		t.Fatalf("exec %s never exited: %v", e.execID, err)
	}
	return st
}

func TestExecRunsInGuest(t *testing.T) {
	f := newVMFixture(t)
	vt := f.started()
	before := runtime.NumGoroutine()
	f.fake.guest.SetProgram("/bin/sh", vmtest.Program{Polls: 2, Code: 3, Out: "out", Err: "err"})
	streams := newExecStdio(t, false)
	e, err := vt.addExec(context.Background(), "e1", streams.stdio, processSpec(t, "/bin/sh", "-c", "exit 3"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := e.start(context.Background())
	if err != nil || pid == 0 {
		t.Fatalf("start: pid %d, %v", pid, err)
	}
	if st := waitExec(t, e); st != 3 {
		t.Fatalf("exit status %d, want 3", st)
	}
	if out, errOut := streams.output(t); out != "out" || errOut != "err" {
		t.Fatalf("stdout %q stderr %q", out, errOut)
	}
	got := f.fake.guest.Started()[0]
	if got.Path != "/bin/sh" || strings.Join(got.Arg, " ") != "-c exit 3" || got.Env[0] != "PATH=/bin" || !got.CaptureOutput {
		t.Fatalf("guest-exec %+v", got)
	}
	// containerd's order: added, started, exit (of the exec, by its id).
	var order []string
	for _, ev := range f.events.events {
		switch ev := ev.(type) {
		case *eventstypes.TaskExecAdded:
			order = append(order, "added "+ev.ExecID)
		case *eventstypes.TaskExecStarted:
			order = append(order, "started "+ev.ExecID)
		case *eventstypes.TaskExit:
			if ev.ContainerID != "vm1" {
				t.Errorf("exec exit of container %q", ev.ContainerID)
			}
			order = append(order, "exit "+ev.ID)
		}
	}
	if strings.Join(order, ",") != "added e1,started e1,exit e1" {
		t.Fatalf("events %v", order)
	}
	if err := vt.deleteExec(e); err != nil {
		t.Fatal(err)
	}
	if _, err := vt.getExec("e1"); !errdefs.IsNotFound(err) {
		t.Fatalf("deleted exec still there: %v", err)
	}
	// Nothing of the exec keeps running in the shim.
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Fatalf("%d goroutines after the exec, %d before", n, before)
	}
}

func TestExecStdinGivenAtOnce(t *testing.T) {
	f := newVMFixture(t)
	vt := f.started()
	f.fake.guest.SetProgram("cat", vmtest.Program{EchoInput: true})
	streams := newExecStdio(t, true)
	e, err := vt.addExec(context.Background(), "e1", streams.stdio, processSpec(t, "cat"))
	if err != nil {
		t.Fatal(err)
	}
	if pid, err := e.start(context.Background()); err != nil || pid != 0 {
		t.Fatalf("start with stdin: pid %d (the command waits for stdin), %v", pid, err)
	}
	if _, err := streams.stdin.Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	streams.stdin.Close()
	e.closeStdin()
	if st := waitExec(t, e); st != 0 {
		t.Fatalf("exit status %d", st)
	}
	if out, _ := streams.output(t); out != "hello\n" {
		t.Fatalf("stdout %q", out)
	}
	if _, pid, _, _ := e.snapshot(); pid == 0 {
		t.Fatal("the exec's pid is not the guest's")
	}
}

func TestExecRefusesBadRequests(t *testing.T) {
	f := newVMFixture(t)
	vt := f.started()
	ctx := context.Background()
	if _, err := vt.addExec(ctx, "e1", stdio{}, processSpec(t)); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "args") {
		t.Errorf("empty args: %v", err)
	}
	_, err := vt.addExec(ctx, "e1", stdio{Terminal: true}, processSpec(t, "sh"))
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "kubectl attach -it") {
		t.Errorf("TTY exec: %v", err)
	}
	if _, err := vt.addExec(ctx, "e1", stdio{Stdout: "tcp://x"}, processSpec(t, "sh")); err == nil {
		t.Error("stdout over tcp accepted")
	}
	if _, err := vt.addExec(ctx, "e1", stdio{}, processSpec(t, "sh")); err != nil {
		t.Fatal(err)
	}
	if _, err := vt.addExec(ctx, "e1", stdio{}, processSpec(t, "sh")); !errdefs.IsAlreadyExists(err) {
		t.Errorf("reused exec id: %v", err)
	}
	if err := vt.pause(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := vt.addExec(ctx, "e2", stdio{}, processSpec(t, "sh")); !errdefs.IsFailedPrecondition(err) ||
		!strings.Contains(err.Error(), "paused") {
		t.Errorf("exec in a paused VM: %v", err)
	}
	e, _ := vt.getExec("e1")
	if _, err := e.start(ctx); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("start in a paused VM: %v", err)
	}
	if err := vt.resume(ctx); err != nil {
		t.Fatal(err)
	}
	f.fake.stop(vt.rec.Domain, vm.StopShutdown)
	vt.resync(ctx)
	if _, err := vt.addExec(ctx, "e3", stdio{}, processSpec(t, "sh")); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("exec in a stopped VM: %v", err)
	}
	vt.mu.Lock()
	n := len(vt.execs)
	vt.mu.Unlock()
	if n != 1 {
		t.Errorf("%d execs registered, want only e1", n)
	}
	if len(f.fake.guest.Started()) != 0 {
		t.Error("a refused exec reached the guest")
	}
}

func TestExecCommandFailures(t *testing.T) {
	f := newVMFixture(t)
	vt := f.started()
	for _, c := range []struct {
		name   string
		absent bool
		code   uint32
		msg    string
	}{
		{"missing", false, exitNotFound, "command not found"},
		{"noagent", true, exitCannotExec, "install qemu-guest-agent"},
	} {
		f.fake.guest.SetAbsent(c.absent)
		streams := newExecStdio(t, false)
		e, err := vt.addExec(context.Background(), c.name, streams.stdio, processSpec(t, "nosuch"))
		if err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		if _, err := e.start(context.Background()); err != nil {
			t.Fatalf("%s: start: %v", c.name, err)
		}
		if st := waitExec(t, e); st != c.code {
			t.Errorf("%s: exit status %d, want %d", c.name, st, c.code)
		}
		if took := time.Since(began); took > 2*time.Second {
			t.Errorf("%s: took %v", c.name, took)
		}
		if _, errOut := streams.output(t); !strings.Contains(errOut, c.msg) {
			t.Errorf("%s: stderr %q does not say %q", c.name, errOut, c.msg)
		}
	}
}

func TestExecKill(t *testing.T) {
	f := newVMFixture(t)
	vt := f.started()
	f.fake.guest.SetProgram("sleep", vmtest.Program{Polls: -1})
	f.fake.guest.SetProgram("kill", vmtest.Program{})
	ctx := context.Background()
	e, err := vt.addExec(ctx, "e1", stdio{}, processSpec(t, "sleep", "1000"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := vt.deleteExec(e); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("delete of a running exec: %v", err)
	}
	if err := e.kill(ctx, uint32(unix.SIGKILL)); err != nil {
		t.Fatal(err)
	}
	if st := waitExec(t, e); st != 137 {
		t.Fatalf("killed exec: status %d", st)
	}
	if err := e.kill(ctx, uint32(unix.SIGKILL)); !errdefs.IsNotFound(err) {
		t.Fatalf("kill of an ended exec: %v", err)
	}
	if n := f.fake.guest.Running(); n != 0 {
		t.Fatalf("%d guest processes left unreported", n)
	}
	// A guest that cannot be reached still ends a SIGKILLed exec.
	e2, _ := vt.addExec(ctx, "e2", stdio{}, processSpec(t, "sleep", "1000"))
	if _, err := e2.start(ctx); err != nil {
		t.Fatal(err)
	}
	f.fake.guest.SetAbsent(true)
	if err := e2.kill(ctx, uint32(unix.SIGKILL)); err != nil {
		t.Fatal(err)
	}
	if st := waitExec(t, e2); st != 137 {
		t.Fatalf("exec killed without an agent: status %d", st)
	}
}

func TestExecEndsWithTheVM(t *testing.T) {
	f := newVMFixture(t)
	vt := f.started()
	f.fake.guest.SetProgram("sleep", vmtest.Program{Polls: -1})
	e, err := vt.addExec(context.Background(), "e1", stdio{}, processSpec(t, "sleep", "1000"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.start(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.fake.stop(vt.rec.Domain, vm.StopDestroyed)
	if st := waitExec(t, e); st != 137 {
		t.Fatalf("exec of a stopped VM: status %d", st)
	}
}

func TestServiceExecCalls(t *testing.T) {
	f := newVMFixture(t)
	vt := f.started()
	f.fake.guest.SetProgram("true", vmtest.Program{})
	s := newTestService(t, &hostFake{})
	s.tasks["vm1"] = vt
	ctx := context.Background()
	if _, err := s.Exec(ctx, &taskAPI.ExecProcessRequest{ID: "vm1", ExecID: "e1", Spec: processSpec(t, "true")}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ResizePty(ctx,
		&taskAPI.ResizePtyRequest{ID: "vm1", ExecID: "e1", Width: 80, Height: 24}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("resize of an exec: %v", err)
	}
	if _, err := s.ResizePty(ctx, &taskAPI.ResizePtyRequest{ID: "vm1", Width: 80, Height: 24}); err != nil {
		t.Errorf("resize of the console: %v", err)
	}
	if _, err := s.Start(ctx, &taskAPI.StartRequest{ID: "vm1", ExecID: "e1"}); err != nil {
		t.Fatal(err)
	}
	w, err := s.Wait(ctx, &taskAPI.WaitRequest{ID: "vm1", ExecID: "e1"})
	if err != nil || w.ExitStatus != 0 {
		t.Fatalf("wait: %v, %v", w, err)
	}
	st, err := s.State(ctx, &taskAPI.StateRequest{ID: "vm1", ExecID: "e1"})
	if err != nil || st.ID != "e1" || st.ExecID != "e1" {
		t.Fatalf("state: %v, %v", st, err)
	}
	if _, err := s.Delete(ctx, &taskAPI.DeleteRequest{ID: "vm1", ExecID: "e1"}); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.tasks["vm1"]; !ok {
		t.Fatal("deleting the exec deleted the task")
	}
	if _, err := s.State(ctx, &taskAPI.StateRequest{ID: "vm1", ExecID: "e1"}); !errdefs.IsNotFound(err) {
		t.Fatalf("state of a deleted exec: %v", err)
	}
}

// A client whose stdin had already ended closes its FIFO end before the
// shim opens its own (ctr task exec </dev/null): no writer ever comes, and
// the exec runs with empty stdin instead of waiting forever.
func TestExecStdinEndedBeforeStart(t *testing.T) {
	f := newVMFixture(t)
	vt := f.started()
	f.fake.guest.SetProgram("cat", vmtest.Program{EchoInput: true})
	streams := newExecStdio(t, true)
	streams.stdin.Close()
	e, err := vt.addExec(context.Background(), "e1", streams.stdio, processSpec(t, "cat"))
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if _, err := e.start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := waitExec(t, e); st != 0 {
		t.Fatalf("exit status %d", st)
	}
	if took := time.Since(began); took > stdinConnect+time.Second {
		t.Fatalf("an exec with an ended stdin took %v", took)
	}
	if got := f.fake.guest.Started(); len(got) != 1 || got[0].InputData != "" {
		t.Fatalf("guest-exec %+v, want one with no input", got)
	}
}

// An exec with nothing to write still waits for its output's reader:
// containerd opens its end of each FIFO in the background, and a FIFO
// whose writer came and went before that open never sees a writer again.
// containerd 1.6's ExecSync would then wait for the exec's output forever.
func TestExecOutputWaitsForALateReader(t *testing.T) {
	p := filepath.Join(t.TempDir(), "out")
	if err := unix.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	out, err := taskio.OpenOutput(ctx, taskio.Stdio{Stdout: p}, taskio.Options{FIFO: taskio.FIFOWait})
	if err != nil {
		t.Fatal(err)
	}
	delivered := make(chan struct{})
	go func() {
		deliver(ctx, out, vm.Exit{Code: exitCannotExec})
		close(delivered)
	}()
	time.Sleep(200 * time.Millisecond) // the reader is late
	select {
	case <-delivered:
		t.Fatal("the exec's empty output was closed before its reader opened the FIFO")
	default:
	}
	read := make(chan error, 1)
	go func() {
		r, err := os.OpenFile(p, os.O_RDONLY, 0) // blocks until a writer is there
		if err == nil {
			_, err = io.ReadAll(r)
			r.Close()
		}
		read <- err
	}()
	select {
	case err := <-read:
		if err != nil {
			t.Fatalf("the late reader: %v", err)
		}
	case <-time.After(5 * time.Second):
		// Let the blocked open go before failing.
		if f, err := os.OpenFile(p, os.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
		t.Fatal("the late reader never found the exec's output (its open waits for a writer that is gone)")
	}
	select {
	case <-delivered:
	case <-time.After(5 * time.Second):
		t.Fatal("the output was not delivered once its reader came")
	}
}

// An exec's output reaches a binary:// logger, stdout and stderr each on
// its own descriptor, and the logger is gone when the exec has ended.
func TestExecOutputToLoggingBinary(t *testing.T) {
	f := newVMFixture(t)
	vt := f.started()
	f.fake.guest.SetProgram("/bin/sh", vmtest.Program{Code: 3, Out: "out", Err: "err"})
	dir := t.TempDir()
	bin, out, pidFile := filepath.Join(dir, "logger"), filepath.Join(dir, "log"), filepath.Join(dir, "pid")
	// Arguments "a" LOG "b" PIDFILE; stderr (fd 4) goes to LOG.err.
	script := "#!/bin/sh\necho $$ > \"$4\"\nexec 5>&-\n/bin/cat <&4 > \"$2.err\" &\n/bin/cat <&3 > \"$2\"\nwait\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	uri := "binary://" + bin + "?a=" + out + "&b=" + pidFile
	e, err := vt.addExec(context.Background(), "e1", stdio{Stdout: uri, Stderr: uri}, processSpec(t, "/bin/sh", "-c", "exit 3"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err = e.start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := waitExec(t, e); st != 3 {
		t.Fatalf("exit status %d, want 3", st)
	}
	for p, want := range map[string]string{out: "out", out + ".err": "err"} {
		if b, readErr := os.ReadFile(p); readErr != nil || string(b) != want {
			t.Errorf("%s holds %q (%v), want %q", p, b, readErr, want)
		}
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if _, err := unix.Wait4(pid, nil, unix.WNOHANG, nil); !errors.Is(err, unix.ECHILD) {
		t.Errorf("logger pid %d not reaped once the exec ended: wait4 says %v", pid, err)
	}
}

// A guest-exec cannot be aimed at another pod's VM through this shim: an
// exec names a task of this shim, never a domain, and the agent command
// goes to that task's own domain. Another pod's VM, running on the same
// libvirt, is out of reach by its container id and by its domain name.
func TestExecCannotReachAnotherPodsVM(t *testing.T) {
	f := newVMFixture(t)
	vt := f.started()
	other := goldenSpecWithIdentity(1000000005)
	dir := t.TempDir()
	other.Console = vm.Console{Socket: filepath.Join(dir, "console.sock"), Log: filepath.Join(dir, "console.log")}
	x, err := vm.Render(&other)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.fake.Define(x); err != nil {
		t.Fatal(err)
	}
	if err := f.fake.Start(other.Name, false); err != nil {
		t.Fatal(err)
	}
	f.fake.guest.SetProgram("true", vmtest.Program{})
	s := newTestService(t, &hostFake{})
	s.tasks["vm1"] = vt
	ctx := context.Background()
	for _, id := range []string{other.Meta.ContainerID, other.Name} {
		_, err := s.Exec(ctx, &taskAPI.ExecProcessRequest{ID: id, ExecID: "e1", Spec: processSpec(t, "true")})
		if !errdefs.IsNotFound(err) {
			t.Errorf("exec aimed at %s (another pod's VM): %v, want NotFound", id, err)
		}
	}
}
