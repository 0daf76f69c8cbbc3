package shim

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// go-libvirt's calls take no context and wait for libvirtd's answer as
// long as it takes: a libvirtd stopped with SIGSTOP, or hung in a kernel
// call, would hold every task call, and the task's lock with it, until it
// answers. boundedDomains puts a bound on each call instead (issue 27):
//
//   - a query (state, statistics, metadata, pids) answers within
//     queryBound, a change of a domain (define, start, stop, resize)
//     within changeBound, a call with its own timeout (the guest agent)
//     within that plus queryBound; past it the call is DeadlineExceeded;
//   - while a call is still unanswered past its bound, every other call
//     fails at once with Unavailable, so a task call that makes several
//     libvirt calls waits for one bound at most;
//   - when libvirtd answers again (the late call returns), calls go
//     through again, with no restart of anything;
//   - releasing a VM (a task's Delete, the cleanup delete) first waits up
//     to changeBound for libvirtd to answer the late calls: containerd
//     does not retry a failed Delete (after a StartContainer that failed
//     for the hang, CRI's cleanup Delete is the only one), and a task left
//     undeleted keeps its container from ever being removed.
//
// A late change may still be carried out once libvirtd resumes (a Define
// or a Start that timed out) after the task call has failed. The release
// that follows (the rollback, CRI's cleanup Delete) waits for libvirtd as
// said above and removes what the late call made. If libvirtd stays away
// past that wait too, the release fails: a late Define leaves a shut-off
// domain whose VM directory is gone, which the sweep removes (sweep.go); a
// late Start leaves a running VM whose task containerd cannot delete
// (docs/limitations.md).
type boundedDomains struct {
	domains
	query, change time.Duration
	// late counts the calls still running past their bound; answered is
	// closed when it drops to 0 (nil while it is 0). Guarded by mu.
	mu       sync.Mutex
	late     int
	answered chan struct{}
}

const (
	queryBound  = 20 * time.Second
	changeBound = 60 * time.Second
)

func newBoundedDomains(d domains) *boundedDomains {
	return &boundedDomains{domains: d, query: queryBound, change: changeBound}
}

var _ domains = (*boundedDomains)(nil)

// bounded runs fn within bound, as described on boundedDomains.
func bounded[T any](b *boundedDomains, what string, bound time.Duration, fn func() (T, error)) (T, error) {
	var zero T
	if n, _ := b.lateCalls(); n > 0 {
		return zero, fmt.Errorf("libvirt %s: libvirtd has not answered %d earlier call(s) within their bound: %w", what, n,
			errdefs.ErrUnavailable)
	}
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		if err := callSafe(context.Background(), "libvirt "+what, func() { r.v, r.err = fn() }); err != nil {
			r.err = err
		}
		done <- r
	}()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	select {
	case r := <-done:
		return r.v, r.err
	case <-timer.C:
	}
	b.addLate(1)
	go func() {
		<-done
		b.addLate(-1)
	}()
	return zero, fmt.Errorf("libvirt %s: libvirtd did not answer within %v: %w", what, bound, context.DeadlineExceeded)
}

// lateCalls is the number of late calls and a channel closed when there
// are none left.
func (b *boundedDomains) lateCalls() (n int, answered <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.late, b.answered
}

func (b *boundedDomains) addLate(d int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.late += d
	switch {
	case b.late == d && d > 0:
		b.answered = make(chan struct{})
	case b.late == 0:
		close(b.answered)
		b.answered = nil
	}
}

// waitAnswering waits up to wait for libvirtd to answer the late calls;
// it reports whether it did (at once when none is late).
func (b *boundedDomains) waitAnswering(wait time.Duration) bool {
	n, answered := b.lateCalls()
	if n == 0 {
		return true
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-answered:
		return true
	case <-t.C:
		return false
	}
}

// boundedErr is bounded for a call that returns only an error.
func boundedErr(b *boundedDomains, what string, bound time.Duration, fn func() error) error {
	_, err := bounded(b, what, bound, func() (struct{}, error) { return struct{}{}, fn() })
	return err
}

func (b *boundedDomains) Define(x []byte) error {
	return boundedErr(b, "define", b.change, func() error { return b.domains.Define(x) })
}

func (b *boundedDomains) Start(name string, paused bool) error {
	return boundedErr(b, "start", b.change, func() error { return b.domains.Start(name, paused) })
}

func (b *boundedDomains) Resume(name string) error {
	return boundedErr(b, "resume", b.change, func() error { return b.domains.Resume(name) })
}

func (b *boundedDomains) Suspend(name string) error {
	return boundedErr(b, "suspend", b.change, func() error { return b.domains.Suspend(name) })
}

func (b *boundedDomains) Shutdown(name string) error {
	return boundedErr(b, "shutdown", b.change, func() error { return b.domains.Shutdown(name) })
}

func (b *boundedDomains) Destroy(name string) error {
	return boundedErr(b, "destroy", b.change, func() error { return b.domains.Destroy(name) })
}

func (b *boundedDomains) Undefine(name string) error {
	return boundedErr(b, "undefine", b.change, func() error { return b.domains.Undefine(name) })
}

func (b *boundedDomains) SetVCPUs(name string, n int) error {
	return boundedErr(b, "set vCPUs", b.change, func() error { return b.domains.SetVCPUs(name, n) })
}

func (b *boundedDomains) State(name string) (vm.State, error) {
	return bounded(b, "state", b.query, func() (vm.State, error) { return b.domains.State(name) })
}

func (b *boundedDomains) Stats(name string) (vm.Stats, error) {
	return bounded(b, "stats", b.query, func() (vm.Stats, error) { return b.domains.Stats(name) })
}

func (b *boundedDomains) Metadata(name string) (vm.Metadata, error) {
	return bounded(b, "metadata", b.query, func() (vm.Metadata, error) { return b.domains.Metadata(name) })
}

func (b *boundedDomains) PID(name string) (int, error) {
	return bounded(b, "pid", b.query, func() (int, error) { return b.domains.PID(name) })
}

func (b *boundedDomains) WatchExit(name string, pid int) (*vm.ExitWatch, error) {
	return bounded(b, "watch exit", b.query, func() (*vm.ExitWatch, error) { return b.domains.WatchExit(name, pid) })
}

func (b *boundedDomains) VirtiofsdPIDs(name string) (daemons, all []int, err error) {
	type pids struct{ daemons, all []int }
	p, err := bounded(b, "virtiofsd pids", b.query, func() (pids, error) {
		d, a, e := b.domains.VirtiofsdPIDs(name)
		return pids{d, a}, e
	})
	return p.daemons, p.all, err
}

func (b *boundedDomains) AgentCommand(name string, cmd []byte, timeout time.Duration) ([]byte, error) {
	return bounded(b, "guest agent command", timeout+b.query, func() ([]byte, error) { return b.domains.AgentCommand(name, cmd, timeout) })
}

func (b *boundedDomains) SetAgentTimeout(name string, timeout time.Duration) error {
	return boundedErr(b, "set agent timeout", b.query, func() error { return b.domains.SetAgentTimeout(name, timeout) })
}

func (b *boundedDomains) VCPUs(name string) (int, error) {
	return bounded(b, "vCPUs", b.query, func() (int, error) { return b.domains.VCPUs(name) })
}

func (b *boundedDomains) SetGuestVCPUs(name string, n int, timeout time.Duration) error {
	return boundedErr(b, "set guest vCPUs", timeout+b.query, func() error { return b.domains.SetGuestVCPUs(name, n, timeout) })
}

func (b *boundedDomains) GuestVCPUs(name string) (int, error) {
	return bounded(b, "guest vCPUs", b.query, func() (int, error) { return b.domains.GuestVCPUs(name) })
}

func (b *boundedDomains) RequestMemory(name string, mib int, timeout time.Duration) (vm.PluggedMemory, error) {
	return bounded(b, "request memory", timeout+b.change, func() (vm.PluggedMemory, error) {
		return b.domains.RequestMemory(name, mib, timeout)
	})
}

func (b *boundedDomains) Plugged(name string) (vm.PluggedMemory, error) {
	return bounded(b, "plugged memory", b.query, func() (vm.PluggedMemory, error) { return b.domains.Plugged(name) })
}

func (b *boundedDomains) Domains() (map[string]vm.Metadata, error) {
	return bounded(b, "list domains", b.query, func() (map[string]vm.Metadata, error) { return b.domains.Domains() })
}

func (b *boundedDomains) Identity(name string) (*vm.Identity, error) {
	return bounded(b, "identity", b.query, func() (*vm.Identity, error) { return b.domains.Identity(name) })
}
