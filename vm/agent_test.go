package vm

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/digitalocean/go-libvirt"
)

// fakeGuest is a guest agent with state: processes it started, how many
// status polls each takes to exit, and what each ends with. Its errors
// are libvirt's, mapped as Conn.AgentCommand maps them.
type fakeGuest struct {
	mu       sync.Mutex
	absent   bool                   // no agent answers
	commands map[string]fakeProgram // by path; others are "not found"
	procs    map[int]*fakeProc
	nextPID  int
	started  []guestExecArgs
	timeouts int // SetAgentTimeout calls
}

type fakeProgram struct {
	polls        int // status calls answered "running" first
	code, signal int
	out, err     string
	truncated    bool
	denied       bool // spawn fails with EACCES
}

type fakeProc struct {
	fakeProgram
	input []byte
}

func newFakeGuest() *fakeGuest {
	return &fakeGuest{commands: map[string]fakeProgram{}, procs: map[int]*fakeProc{}, nextPID: 100}
}

func (g *fakeGuest) SetAgentTimeout(string, time.Duration) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.timeouts++
	return nil
}

func (g *fakeGuest) AgentCommand(domain string, cmd []byte, _ time.Duration) ([]byte, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.absent {
		return nil, mapAgentError(libvirt.Error{Code: uint32(libvirt.ErrAgentUnresponsive), Message: "Guest agent is not responding: QEMU guest agent is not connected"}, domain)
	}
	var req struct {
		Execute   string          `json:"execute"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if err := json.Unmarshal(cmd, &req); err != nil {
		return nil, err
	}
	fail := func(msg string) ([]byte, error) {
		return nil, mapAgentError(libvirt.Error{Code: uint32(libvirt.ErrInternalError), Message: "internal error: unable to execute QEMU agent command '" + req.Execute + "': " + msg}, domain)
	}
	switch req.Execute {
	case "guest-ping":
		return []byte(`{"return":{}}`), nil
	case "guest-exec":
		var a guestExecArgs
		if err := json.Unmarshal(req.Arguments, &a); err != nil {
			return nil, err
		}
		g.started = append(g.started, a)
		prog, ok := g.commands[a.Path]
		if !ok {
			return fail(fmt.Sprintf("Failed to execute child process “%s” (No such file or directory)", a.Path))
		}
		if prog.denied {
			return fail(fmt.Sprintf("Failed to execute child process “%s” (Permission denied)", a.Path))
		}
		in, _ := base64.StdEncoding.DecodeString(a.InputData)
		g.nextPID++
		g.procs[g.nextPID] = &fakeProc{fakeProgram: prog, input: in}
		return json.Marshal(map[string]any{"return": guestExecReply{PID: g.nextPID}})
	case "guest-exec-status":
		var a guestExecStatusArgs
		if err := json.Unmarshal(req.Arguments, &a); err != nil {
			return nil, err
		}
		p, ok := g.procs[a.PID]
		if !ok {
			return fail(fmt.Sprintf("Invalid parameter 'pid'"))
		}
		if p.polls > 0 {
			p.polls--
			return []byte(`{"return":{"exited":false}}`), nil
		}
		delete(g.procs, a.PID)
		r := map[string]any{"exited": true,
			"out-data": base64.StdEncoding.EncodeToString([]byte(p.out + string(p.input))),
			"err-data": base64.StdEncoding.EncodeToString([]byte(p.err))}
		if p.signal != 0 {
			r["signal"] = p.signal
		} else {
			r["exitcode"] = p.code
		}
		if p.truncated {
			r["out-truncated"] = true
		}
		return json.Marshal(map[string]any{"return": r})
	}
	return fail("The command " + req.Execute + " has not been found")
}

func TestAgentRunsCommand(t *testing.T) {
	g := newFakeGuest()
	g.commands["cat"] = fakeProgram{polls: 3, code: 3, out: "out:", err: "warn"}
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
	want := guestExecArgs{Path: "cat", Arg: []string{"-u", "a b"}, Env: []string{"A=1"}, InputData: base64.StdEncoding.EncodeToString([]byte("in")), CaptureOutput: true}
	if !reflect.DeepEqual(g.started, []guestExecArgs{want}) {
		t.Fatalf("guest-exec got %+v, want %+v", g.started, want)
	}
	if _, err := a.Start(Command{Path: "cat"}); err != nil {
		t.Fatal(err)
	}
	if g.timeouts != 1 {
		t.Fatalf("the sync timeout was set %d times, want once", g.timeouts)
	}
}

func TestAgentSignalIsExitCode(t *testing.T) {
	g := newFakeGuest()
	g.commands["sleep"] = fakeProgram{signal: 9}
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
	g := newFakeGuest()
	g.commands["/etc/passwd"] = fakeProgram{denied: true}
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
	g.commands["cat"] = fakeProgram{}
	_, err := a.Start(Command{Path: "cat", Input: make([]byte, MaxExecInput+1)})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), fmt.Sprint(MaxExecInput)) {
		t.Fatalf("stdin over the limit: %v", err)
	}
	if len(g.started) != 2 {
		t.Fatalf("%d guest-exec calls; refused input must not reach the agent", len(g.started))
	}
}

func TestAgentAbsent(t *testing.T) {
	g := newFakeGuest()
	g.absent = true
	a := NewAgent(g, "dom")
	for _, err := range []error{a.Ping(), func() error { _, err := a.Start(Command{Path: "true"}); return err }()} {
		if !errors.Is(err, ErrNoAgent) || !errdefs.IsFailedPrecondition(err) {
			t.Fatalf("no agent: %v", err)
		}
		if !strings.Contains(err.Error(), "install qemu-guest-agent") {
			t.Fatalf("no agent error does not say what to do: %v", err)
		}
	}
}

func TestAgentOutputLimit(t *testing.T) {
	g := newFakeGuest()
	g.commands["yes"] = fakeProgram{code: 0, out: "y\n", truncated: true}
	a := NewAgent(g, "dom")
	pid, _ := a.Start(Command{Path: "yes"})
	_, err := a.Wait(context.Background(), pid)
	if !errors.Is(err, ErrOutputLimit) || !strings.Contains(err.Error(), "MiB") {
		t.Fatalf("truncated output: %v", err)
	}
	// libvirt refusing a reply over its size limit names the limit too.
	err = a.replyTooLarge(&AgentError{Message: "agent reply is too large", err: errors.New("x")}, 7)
	if !errors.Is(err, ErrOutputLimit) {
		t.Fatalf("reply too large: %v", err)
	}
}

func TestAgentWaitCanceled(t *testing.T) {
	g := newFakeGuest()
	g.commands["sleep"] = fakeProgram{polls: 1 << 30}
	a := NewAgent(g, "dom")
	pid, _ := a.Start(Command{Path: "sleep"})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := a.Wait(ctx, pid); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait past its deadline: %v", err)
	}
}

func TestAgentSignalRunsKill(t *testing.T) {
	g := newFakeGuest()
	g.commands["kill"] = fakeProgram{}
	a := NewAgent(g, "dom")
	if err := a.Signal(context.Background(), 42, 9); err != nil {
		t.Fatal(err)
	}
	if got := g.started[0]; got.Path != "kill" || !reflect.DeepEqual(got.Arg, []string{"-9", "42"}) {
		t.Fatalf("kill ran as %+v", got)
	}
	g.commands["kill"] = fakeProgram{code: 1, err: "kill: can't kill pid 42: No such process"}
	if err := a.Signal(context.Background(), 42, 9); err == nil || !strings.Contains(err.Error(), "No such process") {
		t.Fatalf("failed kill: %v", err)
	}
}
