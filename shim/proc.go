package shim

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/protobuf"
)

// proc is the lifecycle state every task has, whatever runs it: a status
// machine (created → running ⇄ paused → stopped) and a once-only exit.
type proc struct {
	id     string
	execID string // set for an exec process of task id
	bundle string
	stdio  stdio

	mu         sync.Mutex
	status     task.Status // guarded by mu
	pid        int         // guarded by mu
	exitStatus uint32      // guarded by mu
	exitedAt   time.Time   // guarded by mu
	exited     chan struct{}
	// lastPid is pid, readable without mu: Connect must answer while a
	// long Start holds mu (containerd gives a shim 5 s to answer it when it
	// restarts, and runs the cleanup delete of a shim that does not).
	lastPid atomic.Int64

	// publish queues the task's events in order. TaskStart and TaskExit
	// are queued under mu, in the step that changes the status, so an
	// exit follows its start and a Wait that returns has its exit queued
	// (a Delete after it cannot overtake).
	publish func(any)
}

type stdio struct {
	Stdin, Stdout, Stderr string
	Terminal              bool
}

func newProc(id, bundle string, io stdio, publish func(any)) proc {
	return proc{id: id, bundle: bundle, stdio: io, status: task.Status_CREATED, exited: make(chan struct{}), publish: publish}
}

func (p *proc) snapshot() (status task.Status, pid int, exitStatus uint32, exitedAt time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.status, p.pid, p.exitStatus, p.exitedAt
}

// name is the process's id in the task API: the exec id of an exec, the
// task id otherwise.
func (p *proc) name() string {
	if p.execID != "" {
		return p.execID
	}
	return p.id
}

// setRunningLocked records the start and queues TaskStart, or
// TaskExecStarted for an exec. The caller checked allowLocked(stepStart)
// under the same hold of mu.
func (p *proc) setRunningLocked(pid int) {
	p.mustMoveLocked(stepStart)
	p.pid = pid
	p.lastPid.Store(int64(pid))
	if p.execID != "" {
		p.publish(&eventstypes.TaskExecStarted{ContainerID: p.id, ExecID: p.execID, Pid: uint32(pid)})
		return
	}
	p.publish(&eventstypes.TaskStart{ContainerID: p.id, Pid: uint32(pid)})
}

// setExitedLocked records the exit once and queues TaskExit before it
// releases the waiters; it reports false if the task had already exited.
func (p *proc) setExitedLocked(status uint32) bool {
	return p.endLocked(status, true)
}

// setDeletedLocked ends a task that is deleted. One that never started
// gets no TaskExit, as with runc: nothing ran, nothing exited.
func (p *proc) setDeletedLocked() {
	p.endLocked(p.exitStatus, false)
}

// deleteStopped ends a process for its Delete: one that is running must
// be killed first.
func (p *proc) deleteStopped() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.allowLocked(stepDelete); err != nil {
		return err
	}
	p.setDeletedLocked()
	return nil
}

// endLocked stops the process once: by its exit (publish) or its delete.
func (p *proc) endLocked(status uint32, publish bool) bool {
	if p.status == task.Status_STOPPED {
		return false
	}
	if publish {
		p.mustMoveLocked(stepExit)
	} else {
		p.mustMoveLocked(stepDelete)
	}
	p.exitStatus = status
	p.exitedAt = time.Now()
	if publish {
		p.publish(&eventstypes.TaskExit{
			ContainerID: p.id, ID: p.name(), Pid: uint32(p.pid),
			ExitStatus: status, ExitedAt: protobuf.ToTimestamp(p.exitedAt),
		})
	}
	close(p.exited)
	return true
}

// wait blocks until the task exits or ctx ends.
func (p *proc) wait(ctx context.Context) (uint32, time.Time, error) {
	select {
	case <-p.exited:
	case <-ctx.Done():
		return 0, time.Time{}, ctx.Err()
	}
	_, _, st, at := p.snapshot()
	return st, at, nil
}

// allow checks that step s may run on the process now.
func (p *proc) allow(s step) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.allowLocked(s)
}

// setExited records the exit once (see setExitedLocked).
func (p *proc) setExited(status uint32) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.setExitedLocked(status)
}

// setPausedLocked records a pause and queues TaskPaused; the caller
// checked allowLocked(stepPause) under the same hold of mu.
func (p *proc) setPausedLocked() {
	p.mustMoveLocked(stepPause)
	p.publish(&eventstypes.TaskPaused{ContainerID: p.id})
}

// setResumedLocked records a resume and queues TaskResumed.
func (p *proc) setResumedLocked() {
	p.mustMoveLocked(stepResume)
	p.publish(&eventstypes.TaskResumed{ContainerID: p.id})
}

// oomLocked queues TaskOOM: the kernel's OOM killer ended the task's
// process. It comes before the TaskExit, as containerd's runc shim sends
// it, so CRI reports the exit as OOMKilled.
func (p *proc) oomLocked() {
	p.publish(&eventstypes.TaskOOM{ContainerID: p.id})
}

// created queues TaskCreate (the service calls it once the task is in its
// table) and, for an exec, TaskExecAdded.
func (p *proc) created(rootfs []*types.Mount) {
	if p.execID != "" {
		p.publish(&eventstypes.TaskExecAdded{ContainerID: p.id, ExecID: p.execID})
		return
	}
	p.publish(&eventstypes.TaskCreate{
		ContainerID: p.id, Bundle: p.bundle, Rootfs: rootfs,
		IO: &eventstypes.TaskIO{Stdin: p.stdio.Stdin, Stdout: p.stdio.Stdout, Stderr: p.stdio.Stderr, Terminal: p.stdio.Terminal},
	})
}

// deleted queues TaskDelete once the task's Delete released it.
func (p *proc) deleted() {
	_, pid, status, at := p.snapshot()
	p.publish(&eventstypes.TaskDelete{
		ContainerID: p.id, ID: p.id, Pid: uint32(pid), ExitStatus: status, ExitedAt: protobuf.ToTimestamp(at),
	})
}
