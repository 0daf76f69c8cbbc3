package shim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"

	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/errdefs"
	"github.com/containerd/fifo"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kvm-shim/containerd-shim-kvm-v1/taskio"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// errTTY is the answer to an exec that asks for a terminal: the guest
// agent runs commands with pipes only.
var errTTY = fmt.Errorf("an exec with a terminal (kubectl exec -it, ctr task exec -t) cannot run in a VM: "+
	"the QEMU guest agent runs commands without one; use `kubectl attach -it` (or `ctr task attach`) "+
	"for the VM's serial console, or exec without a TTY: %w", errdefs.ErrFailedPrecondition)

// Exit codes of an exec the guest could not run, as a shell and container
// runtimes give them; the reason goes to the exec's stderr.
const (
	exitNotFound   = 127 // no such command in the guest
	exitCannotExec = 126 // not executable, no agent, or input or output over the agent's limits
)

// Timing of an exec's end.
const (
	// stdinGrace is how long the stdin reader may still drain after
	// CloseIO before its FIFO is closed under it.
	stdinGrace = time.Second
	// stdinConnect is how long the stdin FIFO may wait for its writer.
	// The client opens its end before it asks for the exec, so the open
	// completes at once; a client whose input had already ended (empty
	// stdin) closed its end unopened, and no writer ever comes.
	stdinConnect = 500 * time.Millisecond
	// killGrace is how long a guest process may take to die after the
	// guest's kill ran, before the exec is reported killed anyway (the
	// agent has no kill of its own; CRI waits for the exit after a
	// timeout).
	killGrace = 2 * time.Second
	// agentLostLimit is how long a running exec waits for an agent that
	// stopped answering before it fails.
	agentLostLimit = 30 * time.Second
)

// execProcess is a command run in a VM's guest through the QEMU guest
// agent: `ctr task exec`, `kubectl exec` without a TTY, exec probes. Its
// stdin is read to EOF first and handed over at once; its output comes
// back when it exits.
type execProcess struct {
	proc
	task  *vmTask
	agent *vm.Agent
	cmd   vm.Command

	guestPID int                // guarded by mu; 0 until the agent started it
	killSig  uint32             // guarded by mu; the signal of the last Kill
	stdin    io.ReadCloser      // guarded by mu; the open stdin FIFO while it is read
	stop     context.CancelFunc // guarded by mu; abandons the run, and a wait for stdin's writer (set at start)
}

var _ taskRunner = (*execProcess)(nil)

// addExec checks an exec request and registers it; nothing runs yet.
func (t *vmTask) addExec(ctx context.Context, execID string, streams stdio, spec *anypb.Any) (*execProcess, error) {
	if streams.Terminal {
		return nil, errTTY
	}
	if execID == "" {
		return nil, fmt.Errorf("exec id is empty: %w", errdefs.ErrInvalidArgument)
	}
	var p specs.Process
	if err := json.Unmarshal(spec.GetValue(), &p); err != nil {
		return nil, fmt.Errorf("exec %s: process spec: %v: %w", execID, err, errdefs.ErrInvalidArgument)
	}
	if len(p.Args) == 0 || p.Args[0] == "" {
		return nil, fmt.Errorf("exec %s: process args are empty: %w", execID, errdefs.ErrInvalidArgument)
	}
	if p.Terminal {
		return nil, errTTY
	}
	if err := checkStdio(streams); err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.checkExecLocked(); err != nil {
		return nil, err
	}
	if _, ok := t.execs[execID]; ok {
		return nil, fmt.Errorf("exec %s in task %s: %w", execID, t.id, errdefs.ErrAlreadyExists)
	}
	if p.Cwd != "" && p.Cwd != "/" || p.User.UID != 0 {
		// The user and directory are the container rootfs's, which the
		// guest does not share: the agent runs commands as itself.
		t.h.warnOnce("exec-user-cwd",
			"exec into a VM runs as the guest agent's user (root) in its working directory; the exec's user and cwd are not applied")
	}
	e := &execProcess{
		proc:  newProc(t.id, t.bundle, streams, t.publish),
		task:  t,
		agent: t.agent,
		cmd:   vm.Command{Path: p.Args[0], Args: p.Args[1:], Env: p.Env},
	}
	e.execID = execID
	if t.execs == nil {
		t.execs = map[string]*execProcess{}
	}
	t.execs[execID] = e
	e.created(nil)
	log.G(ctx).WithField("vm", t.rec.Domain).WithField("exec", execID).WithField("path", e.cmd.Path).Debug("exec added")
	return e, nil
}

// checkExecLocked refuses an exec unless the VM runs (a paused guest
// cannot answer the agent).
func (t *vmTask) checkExecLocked() error {
	if err := t.allowLocked(stepExec); err != nil {
		return err
	}
	if t.agent == nil {
		return fmt.Errorf("exec in task %s: the VM has no agent client: %w", t.id, errdefs.ErrFailedPrecondition)
	}
	return nil
}

func (t *vmTask) getExec(execID string) (*execProcess, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.execs[execID]
	if !ok {
		return nil, fmt.Errorf("exec %s in task %s: %w", execID, t.id, errdefs.ErrNotFound)
	}
	return e, nil
}

// deleteExec forgets an exec that ended or never started.
func (t *vmTask) deleteExec(e *execProcess) error {
	if err := e.deleteStopped(); err != nil {
		return err
	}
	withLock(&t.mu, func() { delete(t.execs, e.execID) })
	return nil
}

// abandonExecs ends the waits of the task's execs: the VM is gone.
func (t *vmTask) abandonExecs() {
	var execs []*execProcess
	withLock(&t.mu, func() {
		for _, e := range t.execs {
			execs = append(execs, e)
		}
	})
	for _, e := range execs {
		e.abandon()
	}
}

// start opens the exec's stdio and starts the command in the guest.
// Without stdin it is started here and its guest pid returned; with
// stdin it starts once stdin reached EOF (pid 0 here).
func (e *execProcess) start(ctx context.Context) (int, error) {
	var err error
	withLock(&e.task.mu, func() { err = e.task.checkExecLocked() })
	if err != nil {
		return 0, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err = e.allowLocked(stepStart); err != nil {
		return 0, err
	}
	// A logging binary gets the exec's id, as containerd's runc shim
	// gives an exec's.
	out, err := taskio.OpenOutput(ctx, taskio.Stdio{Stdout: e.stdio.Stdout, Stderr: e.stdio.Stderr}, taskio.Options{
		ID: e.execID, Namespace: e.task.rec.Namespace, FIFO: taskio.FIFOWait,
	})
	if err != nil {
		return 0, err
	}
	var startErr error
	if e.stdio.Stdin == "" {
		e.guestPID, startErr = e.agent.Start(e.cmd)
		if startErr != nil && !exitsWith(startErr) {
			_ = out.Close()
			return 0, fmt.Errorf("start exec %s: %w", e.execID, startErr)
		}
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	e.stop = cancel
	e.setRunningLocked(e.guestPID)
	goSafe(ctx, "run an exec", func() { e.run(runCtx, out, startErr) })
	return e.guestPID, nil
}

// exitsWith tells the failures to start a command that the exec reports
// as its exit code (with the reason on stderr) rather than as an error:
// a probe then fails as a failing command does, where kubelet drops a
// probe whose exec errored.
func exitsWith(err error) bool {
	return errors.Is(err, vm.ErrCommandNotFound) || errors.Is(err, vm.ErrCommandNotExecutable) ||
		errors.Is(err, vm.ErrNoAgent) || errdefs.IsInvalidArgument(err)
}

// run reads stdin (if any), starts the command if start did not, waits for
// its exit, writes its output and publishes the exit. It is the exec's
// one long-lived goroutine.
func (e *execProcess) run(ctx context.Context, out *taskio.Output, startErr error) {
	defer e.stop()
	var exit vm.Exit
	var err error
	// A bug here must still end the exec, or its Wait would never return.
	if perr := callSafe(ctx, "run an exec", func() { exit, err = e.execute(ctx, startErr) }); perr != nil {
		exit, err = vm.Exit{Code: exitCannotExec}, perr
	}
	if err != nil {
		exit.Stderr = append(exit.Stderr, "containerd-shim-kvm-v1: "+err.Error()+"\n"...)
	}
	deliver(ctx, out, exit)
	e.setExited(uint32(exit.Code))
	l := log.G(ctx).WithField("vm", e.task.rec.Domain).WithField("exec", e.execID).
		WithField("exitCode", exit.Code).WithField("goroutines", runtime.NumGoroutine())
	if err != nil {
		l.WithError(err).Warn("exec failed")
	} else {
		l.Debug("exec ended")
	}
}

// execute returns the command's exit, or the code and error that stand
// for it when it could not run to its end.
func (e *execProcess) execute(ctx context.Context, startErr error) (vm.Exit, error) {
	pid := e.guestPID
	if e.stdio.Stdin != "" {
		input, err := e.readStdin(ctx)
		if err != nil {
			return vm.Exit{Code: exitCannotExec}, fmt.Errorf("read stdin: %w", err)
		}
		if ctx.Err() != nil { // killed while stdin was read
			return vm.Exit{Code: e.killedCode()}, nil
		}
		cmd := e.cmd
		cmd.Input = input
		pid, startErr = e.agent.Start(cmd)
		var sig uint32
		withLock(&e.mu, func() {
			e.guestPID, e.pid = pid, pid
			sig = e.killSig
		})
		if startErr == nil && sig != 0 {
			goSafe(ctx, "signal an exec", func() { _ = e.signal(ctx, sig) })
		}
	}
	switch {
	case errors.Is(startErr, vm.ErrCommandNotFound):
		return vm.Exit{Code: exitNotFound}, startErr
	case startErr != nil:
		return vm.Exit{Code: exitCannotExec}, startErr
	}
	var lostSince time.Time // when the agent or libvirtd stopped answering
	for {
		exit, err := e.agent.Wait(ctx, pid)
		switch {
		case err == nil:
			return exit, nil
		case ctx.Err() != nil:
			return vm.Exit{Code: e.killedCode()}, fmt.Errorf("guest pid %d did not end after its kill; it may still run in the guest", pid)
		case errors.Is(err, vm.ErrOutputLimit):
			return vm.Exit{Code: exitCannotExec}, err
		case errdefs.IsUnavailable(err) || errors.Is(err, vm.ErrNoAgent):
			// libvirtd is reconnecting, or the agent is busy or
			// restarting: the guest process goes on meanwhile.
			if lostSince.IsZero() {
				lostSince = time.Now()
			}
			if time.Since(lostSince) > agentLostLimit {
				return vm.Exit{Code: exitCannotExec}, fmt.Errorf("wait for guest pid %d: nothing answered for %v: %w", pid, agentLostLimit, err)
			}
			select {
			case <-time.After(200 * time.Millisecond):
			case <-ctx.Done():
			}
			continue
		case errdefs.IsFailedPrecondition(err), errdefs.IsNotFound(err):
			// The domain stopped: the process went with the guest.
			return vm.Exit{Code: 128 + int(unix.SIGKILL)}, fmt.Errorf("the VM stopped while guest pid %d ran", pid)
		default:
			return vm.Exit{Code: exitCannotExec}, fmt.Errorf("wait for guest pid %d: %w", pid, err)
		}
	}
}

// readStdin reads the exec's stdin FIFO to its end. A FIFO whose writer
// never opens within stdinConnect is an empty stdin. (CloseIO does not
// cut that wait short: the open may have just completed, and the fifo
// package then picks either outcome.)
func (e *execProcess) readStdin(ctx context.Context) ([]byte, error) {
	in, err := taskio.OpenStdin(ctx, e.stdio.Stdin, stdinConnect)
	if in == nil || err != nil {
		return nil, err
	}
	defer in.Close()
	withLock(&e.mu, func() { e.stdin = in })
	input, err := io.ReadAll(io.LimitReader(in, vm.MaxExecInput+1))
	withLock(&e.mu, func() { e.stdin = nil })
	if err != nil && !errors.Is(err, os.ErrClosed) && !errors.Is(err, fifo.ErrReadClosed) {
		return nil, err
	}
	return input, nil
}

func (e *execProcess) killedCode() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.killSig == 0 {
		return 128 + int(unix.SIGKILL)
	}
	return 128 + int(e.killSig)
}

// kill signals the guest process through the guest's kill. SIGKILL must
// end the exec: if the process has not gone within killGrace (or kill
// could not run), the exec is reported killed and the process left.
func (e *execProcess) kill(ctx context.Context, sig uint32) error {
	pid, done, err := e.markKilled(sig)
	if done {
		return err
	}
	if pid == 0 {
		// Still reading stdin: the command never starts.
		e.abandon()
		e.endStdin(0)
		return nil
	}
	return e.signal(ctx, sig)
}

// markKilled records a kill's signal and returns the guest pid to signal;
// done when the kill is over already: an exec that never started ends
// here, one that ended is NotFound.
func (e *execProcess) markKilled(sig uint32) (pid int, done bool, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.status == task.Status_CREATED {
		e.setExitedLocked(128 + sig)
		return 0, true, nil
	}
	if err := e.allowLocked(stepKill); err != nil {
		return 0, true, err
	}
	e.killSig = sig
	return e.guestPID, false, nil
}

func (e *execProcess) signal(ctx context.Context, sig uint32) error {
	var pid int
	withLock(&e.mu, func() { pid = e.guestPID })
	sctx, cancel := context.WithTimeout(ctx, 2*vm.AgentTimeout)
	defer cancel()
	err := e.agent.Signal(sctx, pid, int(sig))
	if unix.Signal(sig) == unix.SIGKILL {
		if err != nil {
			log.G(ctx).WithError(err).WithField("exec", e.execID).Warn("kill the exec's guest process; reporting it killed")
			e.abandon()
			return nil
		}
		time.AfterFunc(killGrace, e.abandon)
	}
	return err
}

// abandon stops waiting for the guest process.
func (e *execProcess) abandon() {
	var stop context.CancelFunc
	withLock(&e.mu, func() { stop = e.stop })
	if stop != nil {
		stop()
	}
}

// closeStdin ends the exec's input (CloseIO): a FIFO being read is
// drained for up to stdinGrace, then closed.
func (e *execProcess) closeStdin() { e.endStdin(stdinGrace) }

func (e *execProcess) endStdin(grace time.Duration) {
	var in io.ReadCloser
	withLock(&e.mu, func() { in = e.stdin })
	if in != nil {
		time.AfterFunc(grace, func() { in.Close() })
	}
}

func (e *execProcess) pause(context.Context) error {
	return fmt.Errorf("exec %s: an exec is paused with its VM: %w", e.execID, errdefs.ErrNotImplemented)
}

func (e *execProcess) resume(context.Context) error {
	return fmt.Errorf("exec %s: an exec is resumed with its VM: %w", e.execID, errdefs.ErrNotImplemented)
}

// outputTimeout bounds how long an exec's output waits for its reader.
const outputTimeout = 10 * time.Second

// deliver writes the output and closes the stdio (which ends a logging
// binary). A reader that never comes or stops reading loses the output
// after outputTimeout rather than holding the exec.
func deliver(ctx context.Context, out *taskio.Output, exit vm.Exit) {
	done := make(chan struct{})
	goSafe(ctx, "write an exec's output", func() {
		defer close(done)
		writeOutput(ctx, out, exit)
	})
	select {
	case <-done:
	case <-time.After(outputTimeout):
		log.G(ctx).Warn("nobody read the exec's output; dropped")
	}
	if err := out.Close(); err != nil {
		log.G(ctx).WithError(err).Warn("close the exec's output")
	}
}

// write hands the output over. An output with nothing to say is still
// written (zero bytes): a FIFO's write waits until its reader opened it.
// Closed before that, the FIFO would never see a writer again, and a
// reader that opens it late (containerd opens its end in the background)
// would wait for one forever: containerd 1.6's ExecSync then never
// returns, as it waits for the exec's output without a bound.
func writeOutput(ctx context.Context, out *taskio.Output, exit vm.Exit) {
	for _, o := range []struct {
		w    io.Writer
		data []byte
	}{{out.Stdout, exit.Stdout}, {out.Stderr, exit.Stderr}} {
		if o.w == nil {
			continue
		}
		if _, err := o.w.Write(o.data); err != nil {
			log.G(ctx).WithError(err).Debug("write exec output")
		}
	}
}
