package vm

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/kvm-shim/containerd-shim-kvm-v1/vm/vmtest"
)

var _ AgentCommander = (*vmtest.FakeGuest)(nil)

func TestAgentRunsCommand(t *testing.T) {
	g := vmtest.NewFakeGuest()
	g.SetProgram("cat", vmtest.Program{Polls: 3, Code: 3, Out: "out:", Err: "warn", EchoInput: true})
	a := NewAgent(g, "dom")
	pid, err := a.Start(Command{Path: "cat", Args: []string{"-u", "a b"}, Env: []string{"A=1"}, Input: []byte("in")})
	if err != nil {
		t.Fatal(err)
	}
	exit, err := a.Wait(context.Background(), pid)
	if err != nil {
		t.Fatal(err)
	}
	if exit.Code != 3 || string(exit.Stdout) != "out:in" || string(exit.Stderr) != "warn" {
		t.Fatalf("exit %+v", exit)
	}
	want := vmtest.ExecArgs{Path: "cat", Arg: []string{"-u", "a b"}, Env: []string{"A=1"},
		InputData: base64.StdEncoding.EncodeToString([]byte("in")), CaptureOutput: true}
	if got := g.Started(); !reflect.DeepEqual(got, []vmtest.ExecArgs{want}) {
		t.Fatalf("guest-exec got %+v, want %+v", got, want)
	}
	if _, err := a.Start(Command{Path: "cat"}); err != nil {
		t.Fatal(err)
	}
	if n := g.Timeouts(); n != 1 {
		t.Fatalf("the sync timeout was set %d times, want once", n)
	}
}

func TestAgentSignalIsExitCode(t *testing.T) {
	g := vmtest.NewFakeGuest()
	g.SetProgram("sleep", vmtest.Program{Signal: 9})
	a := NewAgent(g, "dom")
	pid, err := a.Start(Command{Path: "sleep", Args: []string{"100"}})
	if err != nil {
		t.Fatal(err)
	}
	exit, err := a.Wait(context.Background(), pid)
	if err != nil || exit.Code != 137 {
		t.Fatalf("exit %+v, %v; want code 137", exit, err)
	}
}

func TestAgentStartFailures(t *testing.T) {
	g := vmtest.NewFakeGuest()
	g.SetProgram("/etc/passwd", vmtest.Program{Denied: true})
	a := NewAgent(g, "dom")
	if _, err := a.Start(Command{Path: "nosuch"}); !errors.Is(err, ErrCommandNotFound) || !strings.Contains(err.Error(), "nosuch") {
		t.Fatalf("missing command: %v", err)
	}
	if _, err := a.Start(Command{Path: "/etc/passwd"}); !errors.Is(err, ErrCommandNotExecutable) {
		t.Fatalf("unrunnable command: %v", err)
	}
	if _, err := a.Start(Command{}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("empty path: %v", err)
	}
	g.SetProgram("cat", vmtest.Program{})
	_, err := a.Start(Command{Path: "cat", Input: make([]byte, MaxExecInput+1)})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), fmt.Sprint(MaxExecInput)) {
		t.Fatalf("stdin over the limit: %v", err)
	}
	if n := len(g.Started()); n != 2 {
		t.Fatalf("%d guest-exec calls; refused input must not reach the agent", n)
	}
}

func TestAgentAbsent(t *testing.T) {
	g := vmtest.NewFakeGuest()
	g.SetAbsent(true)
	a := NewAgent(g, "dom")
	_, err := a.Start(Command{Path: "true"})
	if !errors.Is(err, ErrNoAgent) || !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("no agent: %v", err)
	}
	if !strings.Contains(err.Error(), "install qemu-guest-agent") {
		t.Fatalf("no agent error does not say what to do: %v", err)
	}
}

func TestAgentOutputLimit(t *testing.T) {
	g := vmtest.NewFakeGuest()
	g.SetProgram("yes", vmtest.Program{Out: "y\n", Truncated: true})
	a := NewAgent(g, "dom")
	pid, _ := a.Start(Command{Path: "yes"})
	_, err := a.Wait(context.Background(), pid)
	if !errors.Is(err, ErrOutputLimit) || !strings.Contains(err.Error(), "MiB") {
		t.Fatalf("truncated output: %v", err)
	}
	// libvirt refusing a reply over its size limit names the limit too.
	err = a.replyTooLarge(&AgentError{Message: "No complete agent response found in 10485760 bytes: Numerical result out of range",
		err: errors.New("x")}, 7)
	if !errors.Is(err, ErrOutputLimit) {
		t.Fatalf("reply too large: %v", err)
	}
}

func TestAgentWaitCanceled(t *testing.T) {
	g := vmtest.NewFakeGuest()
	g.SetProgram("sleep", vmtest.Program{Polls: -1})
	a := NewAgent(g, "dom")
	pid, _ := a.Start(Command{Path: "sleep"})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := a.Wait(ctx, pid); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait past its deadline: %v", err)
	}
}

func TestAgentSignalRunsKill(t *testing.T) {
	g := vmtest.NewFakeGuest()
	g.SetProgram("kill", vmtest.Program{})
	g.SetProgram("sleep", vmtest.Program{Polls: -1})
	a := NewAgent(g, "dom")
	pid, _ := a.Start(Command{Path: "sleep"})
	if err := a.Signal(context.Background(), pid, 9); err != nil {
		t.Fatal(err)
	}
	if got := g.Started()[1]; got.Path != "kill" || !reflect.DeepEqual(got.Arg, []string{"-9", fmt.Sprint(pid)}) {
		t.Fatalf("kill ran as %+v", got)
	}
	if exit, err := a.Wait(context.Background(), pid); err != nil || exit.Code != 137 {
		t.Fatalf("killed process: %+v, %v", exit, err)
	}
	g.SetProgram("kill", vmtest.Program{Code: 1, Err: "kill: can't kill pid 42: No such process"})
	if err := a.Signal(context.Background(), 42, 9); err == nil || !strings.Contains(err.Error(), "No such process") {
		t.Fatalf("failed kill: %v", err)
	}
}

// A guest keeps at least one vCPU online; asking for none is refused
// before libvirt is asked.
func TestSetGuestVCPUsBelowOne(t *testing.T) {
	for _, n := range []int{0, -1} {
		if err := (&Conn{}).SetGuestVCPUs("vm", n, time.Second); !errdefs.IsInvalidArgument(err) {
			t.Errorf("SetGuestVCPUs(%d): %v, want InvalidArgument", n, err)
		}
	}
}
