package vm

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/digitalocean/go-libvirt"
)

// ErrNoAgent is the cause of every failure to reach the QEMU guest agent:
// the guest never opened its port, or nothing answers on it.
var ErrNoAgent = errors.New("no QEMU guest agent is answering in the VM; install qemu-guest-agent")

// Limits of what goes through the agent, set by the agent and by libvirt.
const (
	// MaxExecInput is the most stdin an exec gets. It travels base64
	// encoded inside one libvirt RPC string, which libvirt caps at 4 MiB.
	MaxExecInput = 2 << 20
	// MaxExecOutput is the stdout plus stderr an exec may return. qemu-ga
	// keeps up to 16 MiB of each, but libvirt refuses agent replies over
	// 10 MiB, and the output travels base64 encoded (4/3 larger).
	MaxExecOutput = 7 << 20
)

// AgentTimeout is how long one agent command may take before the agent is
// taken for absent. Before the first command after the agent (re)appeared,
// libvirt syncs with it (guest-sync) within the domain's agent response
// timeout, which SetAgentTimeout lowers to AgentSyncTimeout: a port that
// is open with nobody answering fails within that.
const (
	AgentTimeout     = 2 * time.Second
	AgentSyncTimeout = time.Second
)

// AgentCommander sends one guest agent command to a domain through
// libvirt and returns the agent's reply; *Conn in production.
type AgentCommander interface {
	AgentCommand(domain string, cmd []byte, timeout time.Duration) ([]byte, error)
	SetAgentTimeout(domain string, timeout time.Duration) error
}

var _ AgentCommander = (*Conn)(nil)

// AgentCommand runs one guest agent command through libvirt's agent API
// (libvirt owns the agent's socket). It returns libvirt's errors as they
// are; Agent classes them.
func (c *Conn) AgentCommand(name string, cmd []byte, timeout time.Duration) ([]byte, error) {
	l, d, err := c.lookup(name)
	if err != nil {
		return nil, err
	}
	secs := int32((timeout + time.Second - 1) / time.Second)
	out, err := l.QEMUDomainAgentCommand(d, string(cmd), secs, 0)
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("guest agent of domain %s: empty reply", name)
	}
	return []byte(out[0]), nil
}

// SetAgentTimeout sets how long libvirt waits for the domain's agent in
// its own exchanges with it, guest-sync among them. libvirt keeps it
// while the domain runs.
func (c *Conn) SetAgentTimeout(name string, timeout time.Duration) error {
	l, d, err := c.lookup(name)
	if err != nil {
		return err
	}
	if _, err := l.DomainAgentSetResponseTimeout(d, int32((timeout+time.Second-1)/time.Second), 0); err != nil {
		return mapError(err, "set agent timeout of domain "+name)
	}
	return nil
}

// mapAgentError classes an error of an agent command: ErrNoAgent (with
// FailedPrecondition) when no agent answers, an AgentError for what the
// agent answered, and libvirt's classes (FailedPrecondition when the
// domain does not run, NotFound when it is gone).
func mapAgentError(err error, name string) error {
	var lerr libvirt.Error
	if errors.As(err, &lerr) {
		switch libvirt.ErrorNumber(lerr.Code) {
		case libvirt.ErrAgentUnresponsive, libvirt.ErrAgentUnsynced, libvirt.ErrOperationTimeout:
			return fmt.Errorf("domain %s: %w (libvirt: %s): %w", name, ErrNoAgent, lerr.Message, errdefs.ErrFailedPrecondition)
		case libvirt.ErrArgumentUnsupported:
			if strings.Contains(lerr.Message, "agent") {
				return fmt.Errorf("domain %s: %w (libvirt: %s): %w", name, ErrNoAgent, lerr.Message, errdefs.ErrFailedPrecondition)
			}
		}
		return &AgentError{Message: lerr.Message, err: mapError(err, "guest agent of domain "+name)}
	}
	return err // already classed (the domain's lookup), or not libvirt's
}

// AgentError is an error the agent (or libvirt on its behalf) answered
// with, such as guest-exec failing to spawn the command.
type AgentError struct {
	Message string
	err     error
}

func (e *AgentError) Error() string { return e.err.Error() }
func (e *AgentError) Unwrap() error { return e.err }

// Agent runs commands in one domain's guest through the QEMU guest agent.
type Agent struct {
	c      AgentCommander
	domain string

	mu         sync.Mutex
	timeoutSet bool // guarded by mu: SetAgentTimeout succeeded
}

// NewAgent returns the agent client of domain.
func NewAgent(c AgentCommander, domain string) *Agent {
	return &Agent{c: c, domain: domain}
}

// agentCommand is one request in the agent's QMP-like protocol.
type agentCommand struct {
	Execute   string `json:"execute"`
	Arguments any    `json:"arguments,omitempty"`
}

type guestExecArgs struct {
	Path          string   `json:"path"`
	Arg           []string `json:"arg,omitempty"`
	Env           []string `json:"env,omitempty"`
	InputData     string   `json:"input-data,omitempty"`
	CaptureOutput bool     `json:"capture-output"`
}

type guestExecReply struct {
	PID int `json:"pid"`
}

type guestExecStatusArgs struct {
	PID int `json:"pid"`
}

type guestExecStatusReply struct {
	Exited       bool   `json:"exited"`
	ExitCode     *int   `json:"exitcode"`
	Signal       *int   `json:"signal"`
	OutData      string `json:"out-data"`
	ErrData      string `json:"err-data"`
	OutTruncated bool   `json:"out-truncated"`
	ErrTruncated bool   `json:"err-truncated"`
}

// call sends one command and decodes the "return" member of the reply.
func (a *Agent) call(execute string, args, ret any) error {
	cmd, err := json.Marshal(agentCommand{Execute: execute, Arguments: args})
	if err != nil {
		return fmt.Errorf("encode %s: %w", execute, err)
	}
	a.setTimeout()
	out, err := a.c.AgentCommand(a.domain, cmd, AgentTimeout)
	if err != nil {
		return mapAgentError(err, a.domain)
	}
	reply := struct {
		Return json.RawMessage `json:"return"`
	}{}
	if err := json.Unmarshal(out, &reply); err != nil || len(reply.Return) == 0 {
		return fmt.Errorf("guest agent of domain %s: unexpected reply to %s: %.200q", a.domain, execute, out)
	}
	if err := json.Unmarshal(reply.Return, ret); err != nil {
		return fmt.Errorf("guest agent of domain %s: reply to %s: %v", a.domain, execute, err)
	}
	return nil
}

// setTimeout lowers libvirt's sync timeout once per domain start (an
// Agent lives as long as its VM runs). A failure only costs a slower
// "no agent" answer, so it is retried at the next command.
func (a *Agent) setTimeout() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.timeoutSet {
		a.timeoutSet = a.c.SetAgentTimeout(a.domain, AgentSyncTimeout) == nil
	}
}

// Command is a process to run in the guest. Path is looked up in the
// agent's PATH when it has no slash; Args exclude it (argv[1:]).
type Command struct {
	Path  string
	Args  []string
	Env   []string // the whole environment; none leaves the agent's
	Input []byte   // all of stdin, given at once; the command sees EOF after it
}

// Exit is how a guest process ended and what it wrote.
type Exit struct {
	Code           int // exit code, or 128+signal
	Stdout, Stderr []byte
}

// Why a command could not be started in the guest.
var (
	// ErrCommandNotFound: the guest has no such command.
	ErrCommandNotFound = errors.New("command not found in the guest")
	// ErrCommandNotExecutable: it exists but cannot be run.
	ErrCommandNotExecutable = errors.New("command cannot be executed in the guest")
)

// Start starts a command in the guest with its output captured and
// returns its guest pid. A command the guest does not have fails with
// ErrCommandNotFound, one it may not run with ErrCommandNotExecutable.
func (a *Agent) Start(c Command) (int, error) {
	if c.Path == "" {
		return 0, fmt.Errorf("command path is empty: %w", errdefs.ErrInvalidArgument)
	}
	if len(c.Input) > MaxExecInput {
		return 0, fmt.Errorf("stdin of %d bytes is over the %d bytes the guest agent takes in one command: %w", len(c.Input), MaxExecInput,
			errdefs.ErrInvalidArgument)
	}
	args := guestExecArgs{Path: c.Path, Arg: c.Args, Env: c.Env, CaptureOutput: true}
	if len(c.Input) > 0 {
		args.InputData = base64.StdEncoding.EncodeToString(c.Input)
	}
	var r guestExecReply
	if err := a.call("guest-exec", args, &r); err != nil {
		return 0, classifySpawnError(c.Path, err)
	}
	return r.PID, nil
}

// classifySpawnError tells a missing or unrunnable command from other
// failures of guest-exec. The agent reports g_spawn's message, which
// carries the errno text.
func classifySpawnError(path string, err error) error {
	var aerr *AgentError
	if !errors.As(err, &aerr) {
		return err
	}
	switch {
	case strings.Contains(aerr.Message, "No such file or directory"):
		return fmt.Errorf("%q: %w (%s)", path, ErrCommandNotFound, aerr.Message)
	case strings.Contains(aerr.Message, "Permission denied"), strings.Contains(aerr.Message, "Exec format error"):
		return fmt.Errorf("%q: %w (%s)", path, ErrCommandNotExecutable, aerr.Message)
	}
	return err
}

// Status returns the process's exit once it ended; done is false while it
// runs. The agent forgets a process once it reported its exit.
func (a *Agent) Status(pid int) (exit Exit, done bool, err error) {
	var r guestExecStatusReply
	if callErr := a.call("guest-exec-status", guestExecStatusArgs{PID: pid}, &r); callErr != nil {
		return Exit{}, false, callErr
	}
	if !r.Exited {
		return Exit{}, false, nil
	}
	switch {
	case r.Signal != nil:
		exit.Code = 128 + *r.Signal
	case r.ExitCode != nil:
		exit.Code = *r.ExitCode
	}
	if exit.Stdout, err = base64.StdEncoding.DecodeString(r.OutData); err != nil {
		return Exit{}, true, fmt.Errorf("guest agent of domain %s: stdout of pid %d: %w", a.domain, pid, err)
	}
	if exit.Stderr, err = base64.StdEncoding.DecodeString(r.ErrData); err != nil {
		return Exit{}, true, fmt.Errorf("guest agent of domain %s: stderr of pid %d: %w", a.domain, pid, err)
	}
	if r.OutTruncated || r.ErrTruncated || len(exit.Stdout)+len(exit.Stderr) > MaxExecOutput {
		return exit, true, fmt.Errorf("output of guest pid %d (exit code %d) was cut by the guest agent: more than its output limit (%d MiB of "+
			"stdout plus stderr through libvirt): %w",
			pid, exit.Code, MaxExecOutput>>20, ErrOutputLimit)
	}
	return exit, true, nil
}

// ErrOutputLimit is the error of a command that wrote more than the agent
// can return.
var ErrOutputLimit = errors.New("exec output over the guest agent's limit")

// Wait polls the process until it exits, backing off from a few
// milliseconds, or until ctx ends.
func (a *Agent) Wait(ctx context.Context, pid int) (Exit, error) {
	delay := 2 * time.Millisecond
	for {
		exit, done, err := a.Status(pid)
		if done || err != nil {
			return exit, a.replyTooLarge(err, pid)
		}
		select {
		case <-ctx.Done():
			return Exit{}, ctx.Err()
		case <-time.After(delay):
		}
		if delay < 200*time.Millisecond {
			delay = delay * 3 / 2
		}
	}
}

// replyTooLarge names the output limit when libvirt refused an agent reply
// for its size. Measured with libvirt 9.0: the reply to guest-exec-status
// of a command that wrote 9 MB failed with "No complete agent response
// found in 10485760 bytes", and libvirt then refused every later agent
// command of that domain ("not available due to an error") until the
// guest agent reopens its port.
func (a *Agent) replyTooLarge(err error, pid int) error {
	var aerr *AgentError
	if errors.As(err, &aerr) && strings.Contains(aerr.Message, "No complete agent response") {
		return fmt.Errorf("output of guest pid %d is more than libvirt takes from the guest agent (about %d MiB of stdout plus stderr); "+
			"libvirt now refuses this VM's agent until qemu-ga restarts in the guest: %s: %w",
			pid, MaxExecOutput>>20, aerr.Message, ErrOutputLimit)
	}
	return err
}

// Signal sends sig to a guest process by running the guest's kill (the
// agent itself has no way to signal what it started), and waits for kill
// to finish. An argument vector, never a shell line.
func (a *Agent) Signal(ctx context.Context, pid, sig int) error {
	kpid, err := a.Start(Command{Path: "kill", Args: []string{"-" + strconv.Itoa(sig), strconv.Itoa(pid)}})
	if err != nil {
		return fmt.Errorf("signal guest pid %d: %w", pid, err)
	}
	exit, err := a.Wait(ctx, kpid)
	if err != nil {
		return fmt.Errorf("signal guest pid %d: %w", pid, err)
	}
	if exit.Code != 0 {
		return fmt.Errorf("signal guest pid %d: kill exited with %d: %s", pid, exit.Code, strings.TrimSpace(string(exit.Stderr)))
	}
	return nil
}
