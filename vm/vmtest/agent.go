// Package vmtest holds fakes of what package vm talks to, for the unit
// tests of vm and of its callers.
package vmtest

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/digitalocean/go-libvirt"
)

// FakeGuest is a QEMU guest agent reached through libvirt, with state:
// the processes it started, how many status polls each takes to exit and
// what each ends with. It answers as libvirt does, with libvirt errors.
// It implements vm.AgentCommander.
type FakeGuest struct {
	mu       sync.Mutex
	absent   bool               // guarded by mu; no agent answers
	programs map[string]Program // guarded by mu; by path, others are "not found"
	procs    map[int]*fakeProc  // guarded by mu; running and unreported
	nextPID  int                // guarded by mu
	started  []ExecArgs         // guarded by mu
	timeouts int                // guarded by mu; SetAgentTimeout calls
}

// Program is what a command does in the fake guest.
type Program struct {
	Polls        int // status calls answered "running" first; -1 runs until killed
	Code, Signal int
	Out, Err     string
	EchoInput    bool // stdout also gets stdin
	Truncated    bool
	Denied       bool // spawn fails with EACCES
}

// ExecArgs are the arguments of one guest-exec.
type ExecArgs struct {
	Path          string   `json:"path"`
	Arg           []string `json:"arg,omitempty"`
	Env           []string `json:"env,omitempty"`
	InputData     string   `json:"input-data,omitempty"`
	CaptureOutput bool     `json:"capture-output"`
}

type fakeProc struct {
	Program
	input []byte
}

// NewFakeGuest returns a guest whose agent answers and has no programs.
func NewFakeGuest() *FakeGuest {
	return &FakeGuest{programs: map[string]Program{}, procs: map[int]*fakeProc{}, nextPID: 100}
}

// SetProgram installs (or replaces) a command.
func (g *FakeGuest) SetProgram(path string, p Program) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.programs[path] = p
}

// SetAbsent makes the agent stop or start answering.
func (g *FakeGuest) SetAbsent(absent bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.absent = absent
}

// Absent says whether the agent is not answering.
func (g *FakeGuest) Absent() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.absent
}

// Started returns the guest-exec calls so far.
func (g *FakeGuest) Started() []ExecArgs {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]ExecArgs(nil), g.started...)
}

// Running counts processes the agent has not reported as exited.
func (g *FakeGuest) Running() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.procs)
}

// Timeouts counts SetAgentTimeout calls.
func (g *FakeGuest) Timeouts() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.timeouts
}

// SetAgentTimeout records the call.
func (g *FakeGuest) SetAgentTimeout(string, time.Duration) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.timeouts++
	return nil
}

// AgentCommand answers guest-exec and guest-exec-status. A
// "kill -N PID" ends PID with signal N.
func (g *FakeGuest) AgentCommand(domain string, cmd []byte, _ time.Duration) ([]byte, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.absent {
		return nil, libvirt.Error{Code: uint32(libvirt.ErrAgentUnresponsive),
			Message: "Guest agent is not responding: QEMU guest agent is not connected"}
	}
	var req struct {
		Execute   string          `json:"execute"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if err := json.Unmarshal(cmd, &req); err != nil {
		return nil, err
	}
	switch req.Execute {
	case "guest-exec":
		return g.execLocked(req.Execute, req.Arguments)
	case "guest-exec-status":
		return g.execStatusLocked(req.Execute, req.Arguments)
	}
	return nil, agentFailure(req.Execute, "The command "+req.Execute+" has not been found")
}

// agentFailure is the error libvirt gives for an agent command that
// failed in the guest.
func agentFailure(execute, msg string) error {
	return libvirt.Error{Code: uint32(libvirt.ErrInternalError), Message: "internal error: unable to execute QEMU agent command '" +
		execute + "': " + msg}
}

// execLocked answers guest-exec. g.mu is held.
func (g *FakeGuest) execLocked(execute string, args json.RawMessage) ([]byte, error) {
	var a ExecArgs
	if err := json.Unmarshal(args, &a); err != nil {
		return nil, err
	}
	g.started = append(g.started, a)
	prog, ok := g.programs[a.Path]
	if !ok {
		return nil, agentFailure(execute, fmt.Sprintf("Failed to execute child process “%s” (No such file or directory)", a.Path))
	}
	if prog.Denied {
		return nil, agentFailure(execute, fmt.Sprintf("Failed to execute child process “%s” (Permission denied)", a.Path))
	}
	if a.Path == "kill" && len(a.Arg) == 2 {
		var sig, pid int
		_, _ = fmt.Sscanf(a.Arg[0], "-%d", &sig) // a bad argument leaves 0: no such process
		_, _ = fmt.Sscanf(a.Arg[1], "%d", &pid)
		if p, ok := g.procs[pid]; ok {
			p.Polls, p.Signal = 0, sig
		}
	}
	in, _ := base64.StdEncoding.DecodeString(a.InputData)
	g.nextPID++
	g.procs[g.nextPID] = &fakeProc{Program: prog, input: in}
	return json.Marshal(map[string]any{"return": map[string]int{"pid": g.nextPID}})
}

// execStatusLocked answers guest-exec-status. g.mu is held.
func (g *FakeGuest) execStatusLocked(execute string, args json.RawMessage) ([]byte, error) {
	var a struct {
		PID int `json:"pid"`
	}
	if err := json.Unmarshal(args, &a); err != nil {
		return nil, err
	}
	p, ok := g.procs[a.PID]
	if !ok {
		return nil, agentFailure(execute, "Invalid parameter 'pid'")
	}
	if p.Polls != 0 {
		if p.Polls > 0 {
			p.Polls--
		}
		return []byte(`{"return":{"exited":false}}`), nil
	}
	delete(g.procs, a.PID)
	out := p.Out
	if p.EchoInput {
		out += string(p.input)
	}
	r := map[string]any{"exited": true,
		"out-data": base64.StdEncoding.EncodeToString([]byte(out)),
		"err-data": base64.StdEncoding.EncodeToString([]byte(p.Err))}
	if p.Signal != 0 {
		r["signal"] = p.Signal
	} else {
		r["exitcode"] = p.Code
	}
	if p.Truncated {
		r["out-truncated"] = true
	}
	return json.Marshal(map[string]any{"return": r})
}
