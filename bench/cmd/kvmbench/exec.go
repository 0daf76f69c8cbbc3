package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// execRuns is how many ExecSync calls the exec section measures per
// flavour, after execWarmup unmeasured ones.
const (
	execRuns   = 100
	execWarmup = 3
)

// execResult is the exec section on one flavour: what an exec probe
// costs, as ExecSync of `true` through CRI into a running VM pod (the
// shim runs it in the guest through the QEMU guest agent).
type execResult struct {
	Flavour   string    `json:"flavour"`
	Runs      int       `json:"runs"`
	Failures  []string  `json:"failures,omitempty"`
	LatencyMs []float64 `json:"latency_ms"`
	P50Ms     float64   `json:"p50_ms"`
	P99Ms     float64   `json:"p99_ms"`
	// ShimCPUPerExecMs is the pod shim's user+system CPU time over the
	// measured runs (/proc/<pid>/stat before and after) divided by them.
	ShimCPUPerExecMs float64 `json:"shim_cpu_per_exec_ms"`
	// AgentReadyMs is from the VM container running to the first exec
	// that succeeded.
	AgentReadyMs float64 `json:"agent_ready_ms"`
}

// runExec measures the exec section on every flavour, one VM pod each.
func runExec(ctx context.Context, e *env) ([]execResult, error) {
	var out []execResult
	for _, d := range e.daemons {
		logf("exec: containerd %s, %d ExecSync of true", d.name(), execRuns)
		r, err := measureExec(ctx, d)
		if err != nil {
			return out, fmt.Errorf("containerd %s: %w", d.name(), err)
		}
		out = append(out, r)
	}
	return out, nil
}

func measureExec(ctx context.Context, d *daemon) (_ execResult, retErr error) {
	res := execResult{Flavour: d.name(), Runs: execRuns}
	cl, err := d.DialCRI()
	if err != nil {
		return res, err
	}
	defer cl.Close()
	p, err := cl.RunPod(ctx, testenv.PodOptions{Name: "exec", Namespace: "kvmbench", Handler: "kvm"})
	if err != nil {
		return res, err
	}
	defer func() {
		errs := []error{retErr, cl.RemovePod(ctx, p.ID)}
		if left := d.WaitNothingLeft(ctx, goneTimeout); len(left) > 0 {
			errs = append(errs, fmt.Errorf("left behind: %s", strings.Join(left, "; ")))
		}
		retErr = errors.Join(errs...)
	}()
	cid, err := cl.CreateContainer(ctx, p, testenv.ContainerOptions{Name: "vm", Image: d.kernelRef})
	if err != nil {
		return res, err
	}
	if err = cl.StartContainer(ctx, cid); err != nil {
		return res, err
	}
	wctx, cancel := context.WithTimeout(ctx, runningTimeout)
	_, err = cl.WaitContainerState(wctx, cid, cri.ContainerState_CONTAINER_RUNNING, 50*time.Millisecond)
	cancel()
	if err != nil {
		return res, err
	}
	running := time.Now()
	execTrue := func() (time.Duration, error) {
		ectx, cancelExec := context.WithTimeout(ctx, 30*time.Second)
		defer cancelExec()
		start := time.Now()
		r, err := cl.Runtime.ExecSync(ectx, &cri.ExecSyncRequest{ContainerId: cid, Cmd: []string{"true"}, Timeout: 10})
		took := time.Since(start)
		if err == nil && r.ExitCode != 0 {
			err = fmt.Errorf("exit code %d: %s", r.ExitCode, r.Stderr)
		}
		return took, err
	}
	bctx, cancel := context.WithTimeout(ctx, bootTimeout)
	defer cancel()
	if err := testenv.Poll(bctx, 200*time.Millisecond, func() (bool, string) {
		_, err := execTrue()
		return err == nil, fmt.Sprintf("ExecSync true: %v", err)
	}); err != nil {
		return res, fmt.Errorf("the guest agent never answered: %w", err)
	}
	res.AgentReadyMs = ms(time.Since(running))
	for range execWarmup {
		if _, err := execTrue(); err != nil {
			return res, err
		}
	}
	shims := d.ShimProcesses()
	if len(shims) != 1 {
		return res, fmt.Errorf("%d shim processes for one pod: %v", len(shims), shims)
	}
	cpuBefore := processCPU(shims[0].Pid, true)
	for range execRuns {
		took, err := execTrue()
		if err != nil {
			res.Failures = append(res.Failures, err.Error())
			continue
		}
		res.LatencyMs = append(res.LatencyMs, ms(took))
	}
	cpu := processCPU(shims[0].Pid, true) - cpuBefore
	res.ShimCPUPerExecMs = ms(cpu) / execRuns
	s := slices.Clone(res.LatencyMs)
	slices.Sort(s)
	res.P50Ms, res.P99Ms = quantile(s, 0.5), quantile(s, 0.99)
	return res, nil
}

// buildExec adds the exec rows: latency and the shim's CPU per exec.
func (r *results) buildExec() {
	for _, x := range r.Exec {
		sec := "exec (TCG) " + x.Flavour
		r.add(sec, "ExecSync `true` through CRI (an exec probe)",
			fmt.Sprintf("p50 %s ms, p99 %s ms (n=%d, %d failed); first exec %s ms after RUNNING",
				fmtMs(x.P50Ms), fmtMs(x.P99Ms), len(x.LatencyMs), len(x.Failures), fmtMs(x.AgentReadyMs)),
			"no failure", met(len(x.Failures) == 0))
		r.add(sec, "shim CPU time per exec", fmtMs(x.ShimCPUPerExecMs)+" ms (user+system, /proc/<shim pid>/stat over the runs)", "", "info")
	}
}
