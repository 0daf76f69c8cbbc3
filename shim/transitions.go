package shim

import (
	"fmt"
	"strings"

	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/errdefs"
)

// step is what may move a process from one status to another: a task
// call on it, or its exit. Every status check and every status change of
// a task, a sandbox or an exec goes through transitions below, so the
// table is the whole state machine and docs/architecture.md shows it
// (TestTransitionTableInDocs keeps the two the same).
type step string

const (
	stepStart  step = "start"
	stepExec   step = "exec"   // add or start an exec in the task
	stepStats  step = "stats"  // read the VM's statistics
	stepResize step = "update" // resize a running VM
	stepPause  step = "pause"
	stepResume step = "resume"
	stepKill   step = "kill"
	stepExit   step = "exit" // the process ended (QEMU, the guest command, the sandbox)
	stepDelete step = "delete"
)

// steps is the table's column order.
var steps = []step{stepStart, stepExec, stepStats, stepResize, stepPause, stepResume, stepKill, stepExit, stepDelete}

// transitions is the process state machine: for each status, the steps it
// allows and the status each leads to. A step missing from a row is
// refused with refusal's error. Kill on a created process ends it (nothing
// ran, exit 128+signal); on a running or paused one it signals and the
// status changes only when the exit follows.
var transitions = map[task.Status]map[step]task.Status{
	task.Status_CREATED: {
		stepStart: task.Status_RUNNING, stepKill: task.Status_STOPPED,
		stepExit: task.Status_STOPPED, stepDelete: task.Status_STOPPED,
	},
	task.Status_RUNNING: {
		stepExec: task.Status_RUNNING, stepStats: task.Status_RUNNING, stepResize: task.Status_RUNNING,
		stepPause: task.Status_PAUSED, stepKill: task.Status_RUNNING, stepExit: task.Status_STOPPED,
	},
	task.Status_PAUSED: {
		stepStats: task.Status_PAUSED, stepResume: task.Status_RUNNING,
		stepKill: task.Status_PAUSED, stepExit: task.Status_STOPPED,
	},
	task.Status_STOPPED: {
		stepDelete: task.Status_STOPPED,
	},
}

// statuses is the table's row order.
var statuses = []task.Status{task.Status_CREATED, task.Status_RUNNING, task.Status_PAUSED, task.Status_STOPPED}

// hints says what to do about a refused step, where there is something.
var hints = map[task.Status]map[step]string{
	task.Status_RUNNING: {stepDelete: "kill it first"},
	task.Status_PAUSED: {
		stepDelete: "kill it first", stepExec: "resume it first",
		stepResize: "only a running VM is resized live; resume it first",
	},
	task.Status_CREATED: {stepExec: "start it first", stepStats: "start it first", stepResize: "only a running VM is resized live"},
}

// next is the status s leads to from status, and whether s is allowed.
func next(status task.Status, s step) (task.Status, bool) {
	to, ok := transitions[status][s]
	return to, ok
}

// addressesProcess are the steps that reach the process itself: once it
// has finished they are NotFound, what containerd's runc shim answers for
// a process that is gone (and what containerd's metrics collection skips
// quietly).
var addressesProcess = map[step]bool{stepKill: true, stepStats: true}

// refusal is the error for step s on a process of status: NotFound for a
// step that addresses a finished process, FailedPrecondition otherwise.
func refusal(name string, status task.Status, s step) error {
	var class error = errdefs.ErrFailedPrecondition
	what := "task is " + strings.ToLower(status.String())
	if status == task.Status_STOPPED && addressesProcess[s] {
		class, what = errdefs.ErrNotFound, "process already finished"
	}
	if h := hints[status][s]; h != "" {
		what += "; " + h
	}
	return fmt.Errorf("%s %s: %s: %w", s, name, what, class)
}

// allowLocked checks that step s may run on the process now.
func (p *proc) allowLocked(s step) error {
	if _, ok := next(p.status, s); !ok {
		return refusal(p.name(), p.status, s)
	}
	return nil
}

// moveLocked takes step s: the status it leads to, or its refusal.
// Publishing the step's event is the caller's (setRunningLocked,
// setExitedLocked and the pause and resume steps do it in one place with
// the change).
func (p *proc) moveLocked(s step) error {
	to, ok := next(p.status, s)
	if !ok {
		return refusal(p.name(), p.status, s)
	}
	p.status = to
	return nil
}

// transitionTable renders the table as markdown, for the docs.
func transitionTable() string {
	var b strings.Builder
	b.WriteString("| status |")
	for _, s := range steps {
		fmt.Fprintf(&b, " %s |", s)
	}
	b.WriteString("\n|---|")
	b.WriteString(strings.Repeat("---|", len(steps)))
	b.WriteString("\n")
	for _, st := range statuses {
		fmt.Fprintf(&b, "| %s |", strings.ToLower(st.String()))
		for _, s := range steps {
			cell := "refused"
			if to, ok := next(st, s); ok {
				cell = "→ " + strings.ToLower(to.String())
				if to == st {
					cell = "allowed"
				}
			}
			fmt.Fprintf(&b, " %s |", cell)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// mustMoveLocked takes a step the caller checked under the same hold of
// mu; a refusal here is a bug in the caller, and the panic is recovered
// and logged by the task call it happens in.
func (p *proc) mustMoveLocked(s step) {
	if err := p.moveLocked(s); err != nil {
		panic(err)
	}
}

// live tells a process whose program runs: running or paused.
func (p *proc) live() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.liveLocked()
}

// liveLocked is live with mu held.
func (p *proc) liveLocked() bool {
	return p.status == task.Status_RUNNING || p.status == task.Status_PAUSED
}
