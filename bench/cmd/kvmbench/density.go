package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// densityResult is one round of pods started at once through CRI.
type densityResult struct {
	Flavour string `json:"flavour"`
	// Runtime is "kvm" (a VM pod; empty in results from before runc
	// rounds existed) or "runc": the same round with pause containers,
	// what containerd and this host cost for any runtime.
	Runtime string `json:"runtime,omitempty"`
	Pods    int    `json:"pods"`
	// PerPodMs: for every pod that made it, from its RunPodSandbox until
	// ContainerStatus reported its VM container RUNNING.
	PerPodMs []float64 `json:"per_pod_ms"`
	Summary  Summary   `json:"per_pod"`
	// WallMs: from the start of the round until the last pod was RUNNING.
	WallMs float64 `json:"wall_ms"`
	// ControlPlaneMs: CPU time per pod of containerd, the shims, libvirtd
	// and virtlogd over the same span (sampleControlPlane); QEMU's own
	// time, which runs the guests, is not in it.
	ControlPlaneMs      map[string]float64 `json:"control_plane_cpu_ms_per_pod,omitempty"`
	ControlPlaneTotalMs float64            `json:"control_plane_cpu_ms_per_pod_total,omitempty"`
	Failures            []string           `json:"failures,omitempty"`
	Leftovers           []string           `json:"leftovers,omitempty"`
	// Rounds: how many rounds of Pods pods this result merges (0 in
	// results from before rounds were repeated: one). WallMs and the
	// control-plane CPU are then means over the rounds, PerPodMs holds
	// every pod of every round.
	Rounds int `json:"rounds,omitempty"`
}

// densityMinPods is how many pods a pod count's rounds start in all at
// least: a count below it is repeated (1 pod: 10 rounds). One lone pod's
// control-plane CPU is a few 10 ms ticks per process, too coarse to
// divide by; and its per-pod time is the denominator of the growth.
const densityMinPods = 10

// densityRepeats is the number of rounds for n pods at once.
func densityRepeats(n int) int {
	return max(1, (densityMinPods+n-1)/n)
}

// mergeRounds makes one result of repeated rounds of the same pod count.
func mergeRounds(rounds []densityResult) densityResult {
	out := rounds[0]
	out.PerPodMs, out.Failures, out.Leftovers = nil, nil, nil
	out.WallMs, out.ControlPlaneTotalMs = 0, 0
	out.ControlPlaneMs = map[string]float64{}
	out.Rounds = len(rounds)
	k := float64(len(rounds))
	for _, r := range rounds {
		out.PerPodMs = append(out.PerPodMs, r.PerPodMs...)
		out.Failures = append(out.Failures, r.Failures...)
		out.Leftovers = append(out.Leftovers, r.Leftovers...)
		out.WallMs += r.WallMs / k
		out.ControlPlaneTotalMs += r.ControlPlaneTotalMs / k
		for c, v := range r.ControlPlaneMs {
			out.ControlPlaneMs[c] += v / k
		}
	}
	out.Summary = summarize(out.PerPodMs)
	return out
}

// densityPoll is how often each pod's goroutine asks ContainerStatus.
const densityPoll = 20 * time.Millisecond

// runDensity measures section 4 on every flavour: VM pods, then the same
// rounds with runc pause pods as the reference.
func runDensity(ctx context.Context, e *env) ([]densityResult, error) {
	var out []densityResult
	for _, d := range e.daemons {
		for _, rt := range []string{"kvm", "runc"} {
			// One pod first, not counted: the first VM with a network
			// after a new emulator wrapper path waits seconds for
			// libvirt to probe it, which would inflate the 1-pod round.
			logf("density: containerd %s, warm-up %s pod", d.name(), rt)
			if w, err := densityRound(ctx, e, d, rt, 1); err != nil {
				return out, fmt.Errorf("containerd %s, warm-up %s pod: %w", d.name(), rt, err)
			} else if len(w.Failures)+len(w.Leftovers) > 0 {
				return out, fmt.Errorf("containerd %s, warm-up %s pod: %s", d.name(), rt, strings.Join(append(w.Failures, w.Leftovers...), "; "))
			}
			for _, n := range e.cfg.densityPods {
				var rounds []densityResult
				for i, k := 0, densityRepeats(n); i < k; i++ {
					logf("density: containerd %s, %d %s pod(s) at once, round %d/%d", d.name(), n, rt, i+1, k)
					r, err := densityRound(ctx, e, d, rt, n)
					if err != nil {
						return out, fmt.Errorf("containerd %s, %d %s pods: %w", d.name(), n, rt, err)
					}
					logf("density: %d/%d RUNNING, median %.0f ms per pod, %d failure(s)", len(r.PerPodMs), n, r.Summary.Median, len(r.Failures))
					rounds = append(rounds, r)
					select {
					case <-ctx.Done():
						return append(out, mergeRounds(rounds)), ctx.Err()
					case <-time.After(2 * time.Second): // let the host go idle
					}
				}
				out = append(out, mergeRounds(rounds))
			}
		}
	}
	return out, nil
}

// densityRound starts n pods of runtime ("kvm": a VM container; "runc":
// a pause container) concurrently, one goroutine each, then removes them
// all and checks that nothing is left.
func densityRound(ctx context.Context, e *env, d *daemon, runtime string, n int) (densityResult, error) {
	res := densityResult{Flavour: d.name(), Runtime: runtime, Pods: n}
	ctr := testenv.ContainerOptions{Name: "vm", Image: d.kernelRef}
	if runtime != "kvm" {
		ctr = testenv.ContainerOptions{Name: "pause", Image: d.pauseRef}
	}
	cl, err := d.DialCRI()
	if err != nil {
		return res, err
	}
	defer cl.Close()

	type outcome struct {
		pod *testenv.Pod
		dur time.Duration
		err error
	}
	outcomes := make([]outcome, n)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			o := &outcomes[i]
			t0 := time.Now()
			o.pod, o.err = cl.RunPod(ctx,
				testenv.PodOptions{Name: fmt.Sprintf("dens-%s-%d-%d", runtime, n, i), Namespace: "kvmbench", Handler: runtime})
			if o.err != nil {
				return
			}
			var cid string
			if cid, o.err = cl.CreateContainer(ctx, o.pod, ctr); o.err != nil {
				return
			}
			if o.err = cl.StartContainer(ctx, cid); o.err != nil {
				return
			}
			wctx, cancel := context.WithTimeout(ctx, runningTimeout)
			defer cancel()
			if _, o.err = cl.WaitContainerState(wctx, cid, cri.ContainerState_CONTAINER_RUNNING, densityPoll); o.err != nil {
				return
			}
			o.dur = time.Since(t0)
		}()
	}
	cpuBefore := sampleControlPlane(d)
	start := time.Now()
	close(gate)
	wg.Wait()
	res.WallMs = ms(time.Since(start))
	cpu := sampleControlPlane(d).sub(cpuBefore)
	res.ControlPlaneMs, res.ControlPlaneTotalMs = cpu.msPerPod(n), ms(cpu.total())/float64(n)

	for i, o := range outcomes {
		if o.err != nil {
			res.Failures = append(res.Failures, fmt.Sprintf("pod %d: %v", i, o.err))
			continue
		}
		res.PerPodMs = append(res.PerPodMs, ms(o.dur))
	}
	res.Summary = summarize(res.PerPodMs)

	// Remove everything, concurrently as kubelet would, then check.
	var pods []*testenv.Pod
	for _, o := range outcomes {
		if o.pod != nil {
			pods = append(pods, o.pod)
		}
	}
	res.Failures = append(res.Failures, removePods(ctx, cl, pods)...)
	res.Leftovers = d.WaitNothingLeft(ctx, 2*goneTimeout)
	if len(res.Leftovers) > 0 {
		logf("density: left behind: %s", strings.Join(res.Leftovers, "; "))
		dumpShimStacks(e, d)
		d.ForceCleanup(ctx)
	}
	return res, nil
}

// removePods removes pods concurrently, as kubelet would, and returns
// what failed.
func removePods(ctx context.Context, cl *testenv.CRI, pods []*testenv.Pod) []string {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string // guarded by mu
	for _, p := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := cl.RemovePod(context.WithoutCancel(ctx), p.ID); err != nil {
				mu.Lock()
				defer mu.Unlock()
				failures = append(failures, "remove: "+err.Error())
			}
		}()
	}
	wg.Wait()
	return failures
}

// dumpShimStacks takes a goroutine dump of every shim still serving d and
// keeps the work dir, so that a leftover can be understood afterwards. A
// shim's stderr is the log FIFO of its bundle, which containerd stops
// reading once it gave up on the shim: the dump is read from the FIFO here
// (through /proc/<pid>/fd/2) while SIGQUIT makes the Go runtime write it
// and end the process.
func dumpShimStacks(e *env, d *daemon) {
	e.keepWork = true
	for _, p := range d.ShimProcesses() {
		path := filepath.Join(e.work, fmt.Sprintf("leftover-shim-%d.txt", p.Pid))
		f, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/2", p.Pid), os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			logf("leftover shim %d: open its stderr: %v", p.Pid, err)
			continue
		}
		_ = syscall.Kill(p.Pid, syscall.SIGQUIT)
		var dump bytes.Buffer
		deadline := time.Now().Add(3 * time.Second)
		buf := make([]byte, 64<<10)
		for time.Now().Before(deadline) {
			n, err := f.Read(buf)
			dump.Write(buf[:n])
			if n == 0 || err != nil {
				time.Sleep(20 * time.Millisecond)
			}
		}
		f.Close()
		if err := os.WriteFile(path, append([]byte(p.Cmdline+"\n\n"), dump.Bytes()...), 0o644); err != nil {
			logf("leftover shim %d: %v", p.Pid, err)
			continue
		}
		logf("goroutine dump of leftover shim %d: %s (%d bytes)", p.Pid, path, dump.Len())
	}
}
