package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// A shim learns of its VMs' exits from their QEMU processes' pidfds and
// subscribes to no libvirt events (go-libvirt can only register its
// lifecycle callbacks for every domain: it passes no domain to
// ConnectDomainEventCallbackRegisterAny, and its stream routing is
// unexported, so subscribed shims got N×N events for N VM pods). The
// events section measures what other domains' lifecycle events cost the
// shims and libvirtd: with no subscriber, nothing per shim.

// eventsPerPodLife is about how many lifecycle events one VM pod's life
// makes: defined, started, suspended and resumed (the shim starts it
// paused), stopped, undefined.
const eventsPerPodLife = 6

// eventsConcurrency is how many pod sandboxes start at once.
const eventsConcurrency = 5

// eventsResult is one flavour with a number of idle pod shims, each
// connected to libvirtd (a CRI pod sandbox's shim connects ahead of its
// first VM; the pods use the host's network, so no netns or CNI is
// involved), while a scratch domain that never runs is defined and
// undefined: every cycle is two lifecycle events (defined, undefined)
// that libvirtd would send to every subscriber.
type eventsResult struct {
	Flavour string  `json:"flavour"`
	Shims   int     `json:"shims"`
	Events  int     `json:"events"`
	WallMs  float64 `json:"wall_ms"`
	// ShimsCPUMs and LibvirtdCPUMs are user+system CPU (/proc/<pid>/stat)
	// over the events: summed over every pod shim, and libvirtd's. The
	// Idle* figures are the same processes over an idle span as long.
	ShimsCPUMs        float64 `json:"shims_cpu_ms"`
	LibvirtdCPUMs     float64 `json:"libvirtd_cpu_ms"`
	IdleShimsCPUMs    float64 `json:"idle_shims_cpu_ms"`
	IdleLibvirtdCPUMs float64 `json:"idle_libvirtd_cpu_ms"`
	// ShimUsPerEvent is the shims' CPU above idle per event per shim.
	ShimUsPerEvent float64 `json:"shim_cpu_us_per_event_per_shim"`
	// LibvirtdUsPerEvent is libvirtd's CPU above idle per event (its work
	// on the define and undefine themselves included).
	LibvirtdUsPerEvent float64  `json:"libvirtd_cpu_us_per_event"`
	Leftovers          []string `json:"leftovers,omitempty"`
}

// runEvents measures every flavour with each of -events-shims idle pods.
func runEvents(ctx context.Context, e *env) ([]eventsResult, error) {
	var out []eventsResult
	for _, d := range e.daemons {
		for _, n := range e.cfg.eventsShims {
			logf("events: containerd %s, %d pod shims, %d lifecycle events", d.name(), n, e.cfg.eventsCount)
			r, err := measureEvents(ctx, e, d, n)
			out = append(out, r)
			logf("events: %d shims: %.1f µs of shim CPU per event per shim, libvirtd %.1f µs per event",
				n, r.ShimUsPerEvent, r.LibvirtdUsPerEvent)
			if err != nil {
				return out, fmt.Errorf("containerd %s, %d shims: %w", d.name(), n, err)
			}
		}
	}
	return out, nil
}

func measureEvents(ctx context.Context, e *env, d *daemon, n int) (res eventsResult, retErr error) {
	res = eventsResult{Flavour: d.name(), Shims: n, Events: 2 * (e.cfg.eventsCount / 2)}
	cl, err := d.DialCRI()
	if err != nil {
		return res, err
	}
	defer cl.Close()
	defer func() {
		_, removeAllPodsErr := cl.RemoveAllPods(context.WithoutCancel(ctx))
		res.Leftovers = d.WaitNothingLeft(context.WithoutCancel(ctx), 2*goneTimeout)
		if len(res.Leftovers) > 0 {
			removeAllPodsErr = errors.Join(removeAllPodsErr, fmt.Errorf("left behind: %s", strings.Join(res.Leftovers, "; ")))
		}
		retErr = errors.Join(retErr, removeAllPodsErr)
	}()
	if err = runIdlePods(ctx, cl, n); err != nil {
		return res, err
	}
	shims, err := waitConnected(ctx, d, n)
	if err != nil {
		return res, err
	}
	libvirtd := testenv.DaemonPid("libvirtd")
	if libvirtd == 0 {
		return res, errors.New("libvirtd has no live pid in /run/libvirtd.pid")
	}
	gen, err := newEventSource(ctx, e)
	if err != nil {
		return res, err
	}
	defer gen.close()

	shimsBefore, lvBefore := shimsCPU(shims), processCPU(libvirtd, false)
	start := time.Now()
	if err := gen.cycles(res.Events / 2); err != nil {
		return res, err
	}
	wall := time.Since(start)
	// The last events may still be on their way to the shims.
	time.Sleep(500 * time.Millisecond)
	res.WallMs = ms(wall)
	res.ShimsCPUMs = ms(shimsCPU(shims) - shimsBefore)
	res.LibvirtdCPUMs = ms(processCPU(libvirtd, false) - lvBefore)

	shimsBefore, lvBefore = shimsCPU(shims), processCPU(libvirtd, false)
	select {
	case <-time.After(wall + 500*time.Millisecond):
	case <-ctx.Done():
		return res, ctx.Err()
	}
	res.IdleShimsCPUMs = ms(shimsCPU(shims) - shimsBefore)
	res.IdleLibvirtdCPUMs = ms(processCPU(libvirtd, false) - lvBefore)

	if len(d.ShimProcesses()) != n {
		return res, fmt.Errorf("%d shim processes after the events, want %d: some ended during the measurement", len(d.ShimProcesses()), n)
	}
	res.ShimUsPerEvent = 1000 * (res.ShimsCPUMs - res.IdleShimsCPUMs) / float64(res.Events*n)
	res.LibvirtdUsPerEvent = 1000 * (res.LibvirtdCPUMs - res.IdleLibvirtdCPUMs) / float64(res.Events)
	return res, nil
}

// runIdlePods runs n kvm pod sandboxes, eventsConcurrency at a time.
func runIdlePods(ctx context.Context, cl *testenv.CRI, n int) error {
	sem := make(chan struct{}, eventsConcurrency)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			_, errs[i] = cl.RunPod(ctx,
				testenv.PodOptions{Name: fmt.Sprintf("events-%02d", i), Namespace: "kvmbench", Handler: "kvm", HostNetwork: true})
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// waitConnected waits until each of the daemon's n shims is a client of
// libvirtd (virt-admin lists the peer pid of every client): a pod
// sandbox's shim connects in the background. It returns the shims' pids.
func waitConnected(ctx context.Context, d *daemon, n int) ([]int, error) {
	var pids []int
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	err := testenv.Poll(wctx, time.Second, func() (bool, string) {
		var ok bool
		var status string
		pids, ok, status = d.ShimsConnected(n)
		return ok, status
	})
	return pids, err
}

func shimsCPU(pids []int) time.Duration {
	var sum time.Duration
	for _, p := range pids {
		sum += processCPU(p, false)
	}
	return sum
}

// eventSource makes lifecycle events: it defines and undefines a domain
// that is never started, on a connection of its own.
type eventSource struct {
	conn *vm.Conn
	name string
	xml  []byte
}

func newEventSource(ctx context.Context, e *env) (*eventSource, error) {
	name := fmt.Sprintf("kvmbench-events-%d", os.Getpid())
	dir := filepath.Join(e.work, "events")
	spec := vm.Spec{
		Name:      name,
		UUID:      fmt.Sprintf("7a2e5c1d-3b4f-4e6a-8c9d-%012x", os.Getpid()),
		VCPUs:     1,
		MemoryMiB: 64,
		Accel:     vm.AccelTCG,
		Emulator:  "/usr/bin/qemu-system-x86_64",
		Machine:   "q35",
		Kernel:    &vm.Kernel{Path: filepath.Join(dir, "vmlinuz")}, // never started
		Console:   vm.Console{Socket: filepath.Join(dir, "console.sock"), Log: filepath.Join(dir, "console.log")},
		Meta:      vm.Metadata{ContainerID: "events", Namespace: "kvmbench", StateDir: dir},
	}
	x, err := vm.Render(&spec)
	if err != nil {
		return nil, err
	}
	conn, err := vm.Connect(ctx, vm.DefaultSocket)
	if err != nil {
		return nil, err
	}
	go func() {
		for range conn.Events() {
		}
	}()
	return &eventSource{conn: conn, name: name, xml: x}, nil
}

// cycles defines and undefines the domain n times: 2n events.
func (s *eventSource) cycles(n int) error {
	for range n {
		if err := s.conn.Define(s.xml); err != nil {
			return err
		}
		if err := s.conn.Undefine(s.name); err != nil {
			return err
		}
	}
	return nil
}

func (s *eventSource) close() {
	_ = s.conn.Undefine(s.name)
	_ = s.conn.Close()
}

// buildEvents adds the events rows and, from the smallest and largest shim
// counts of a flavour, what one more shim costs libvirtd per event.
func (r *results) buildEvents() {
	byFlavour := map[string][]eventsResult{}
	var order []string
	for _, x := range r.Events {
		if _, ok := byFlavour[x.Flavour]; !ok {
			order = append(order, x.Flavour)
		}
		byFlavour[x.Flavour] = append(byFlavour[x.Flavour], x)
		sec := "events " + x.Flavour
		r.add(sec, fmt.Sprintf("%d idle pod shims connected, %d lifecycle events", x.Shims, x.Events),
			fmt.Sprintf("shim CPU %.1f µs per event per shim (all shims %s ms, idle %s ms); "+
				"libvirtd %.1f µs per event (%s ms, idle %s ms); %s ms wall",
				x.ShimUsPerEvent, fmtMs(x.ShimsCPUMs), fmtMs(x.IdleShimsCPUMs),
				x.LibvirtdUsPerEvent, fmtMs(x.LibvirtdCPUMs), fmtMs(x.IdleLibvirtdCPUMs), fmtMs(x.WallMs)),
			"", "info")
	}
	for _, f := range order {
		xs := byFlavour[f]
		lo, hi := xs[0], xs[len(xs)-1]
		if hi.Shims <= lo.Shims {
			continue
		}
		perShimLv := (hi.LibvirtdUsPerEvent - lo.LibvirtdUsPerEvent) / float64(hi.Shims-lo.Shims)
		perShim := hi.ShimUsPerEvent + perShimLv
		perEvent := float64(hi.Shims) * perShim // µs of CPU per event on the node
		r.Derived["events_"+f+"_libvirtd_us_per_event_per_shim"] = perShimLv
		r.Derived["events_"+f+"_us_per_event_per_shim"] = perShim
		// Heavy churn: every pod's VM re-created once a minute, about six
		// lifecycle events each (defined, started, suspended, resumed,
		// stopped, undefined).
		rate := float64(hi.Shims) * eventsPerPodLife / 60
		node := rate * perEvent / 1000 // ms of CPU per second
		r.add("events "+f, fmt.Sprintf("other domains' events at %d VM pods", hi.Shims),
			fmt.Sprintf("%.1f µs per event per shim (shim %.1f + libvirtd %.1f), %.2f ms per event on the node; with every pod re-created once a "+
				"minute (%.1f events/s): %.1f ms CPU per second (%.2f%% of one core)",
				perShim, hi.ShimUsPerEvent, perShimLv, perEvent/1000, rate, node, node/10),
			"negligible (< 1% of a core)", met(node < 10))
	}
}
