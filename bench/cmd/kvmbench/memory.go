package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// settle is how long the pods run idle before their shims are measured.
const settle = 3 * time.Second

// memoryAnnotations give the section's guests no_timer_check: with tens of
// TCG guests booting on two cores, a guest kernel's IO-APIC timer check
// fails now and then and it panics ("IO-APIC + timer doesn't work!", 12
// of 50 in a first 50-pod run), which says nothing of the memory measured.
var memoryAnnotations = map[string]string{"kvm.containerd.io/kernel-cmdline": "console=ttyS0 no_timer_check"}

// memoryResult is the shims' memory with a number of pods of one kind.
type memoryResult struct {
	Flavour string `json:"flavour"`
	Runtime string `json:"runtime"` // "kvm": VM pods; "runc": pause-only pods
	Pods    int    `json:"pods"`
	Shims   int    `json:"shim_processes"`
	// PSSKiB and RSSKiB are per shim process, from /proc/<pid>/smaps_rollup.
	PSSKiB []int `json:"pss_kib"`
	RSSKiB []int `json:"rss_kib"`
	// PSSAnonKiB and PSSFileKiB split PSS: heap and stacks, and the
	// mapped binary and libraries.
	PSSAnonKiB []int `json:"pss_anon_kib"`
	PSSFileKiB []int `json:"pss_file_kib"`
	// Per pod: the sum over the shims divided by the pods.
	PSSPerPodMiB     float64 `json:"pss_per_pod_mib"`
	RSSPerPodMiB     float64 `json:"rss_per_pod_mib"`
	PSSAnonPerPodMiB float64 `json:"pss_anon_per_pod_mib"`
	PSSFilePerPodMiB float64 `json:"pss_file_per_pod_mib"`
	// Node is what the VM pods cost beside their shims (kvm rounds only).
	Node *nodeCost `json:"node_cost,omitempty"`
}

// runMemory measures section 3 on every flavour: our shim with VM pods,
// then containerd-shim-runc-v2 with pause-only pods, in the same daemon.
func runMemory(ctx context.Context, e *env) ([]memoryResult, error) {
	var out []memoryResult
	for _, d := range e.daemons {
		for _, n := range e.cfg.memoryPods {
			for _, rt := range []string{"kvm", "runc"} {
				logf("memory: containerd %s, %d %s pod(s)", d.name(), n, rt)
				r, err := measurePods(ctx, d, rt, n)
				if err != nil {
					return out, fmt.Errorf("containerd %s, %d %s pods: %w", d.name(), n, rt, err)
				}
				out = append(out, r)
			}
		}
	}
	return out, nil
}

// measurePods starts n pods (kvm: a sandbox and a VM container that boots
// to userspace; runc: the sandbox only), lets them settle, reads the
// memory of every shim of the daemon, and removes the pods.
func measurePods(ctx context.Context, d *daemon, runtime string, n int) (_ memoryResult, retErr error) {
	res := memoryResult{Flavour: d.name(), Runtime: runtime, Pods: n}
	cl, err := d.DialCRI()
	if err != nil {
		return res, err
	}
	defer cl.Close()
	var pods []*testenv.Pod
	defer func() {
		var errs []error
		for _, p := range pods {
			errs = append(errs, cl.RemovePod(ctx, p.ID))
		}
		if left := d.WaitNothingLeft(ctx, goneTimeout); len(left) > 0 {
			errs = append(errs, fmt.Errorf("left behind: %s", strings.Join(left, "; ")))
		}
		retErr = errors.Join(retErr, errors.Join(errs...))
	}()

	daemonsBefore, err := daemonRSS()
	if err != nil {
		return res, err
	}
	var logs []string
	for i := 0; i < n; i++ {
		p, err := cl.RunPod(ctx, testenv.PodOptions{Name: fmt.Sprintf("mem-%s-%d", runtime, i), Namespace: "kvmbench", Handler: runtime})
		if err != nil {
			return res, err
		}
		pods = append(pods, p)
		if runtime != "kvm" {
			continue
		}
		cid, err := cl.CreateContainer(ctx, p, testenv.ContainerOptions{Name: "vm", Image: d.kernelRef, Annotations: memoryAnnotations})
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
		logs = append(logs, p.LogPath("vm"))
	}
	// Every guest up: the shim then has its steady state (console copy
	// running, QEMU watched).
	bctx, cancel := context.WithTimeout(ctx, time.Duration(n)*bootTimeout)
	defer cancel()
	for _, path := range logs {
		if err := testenv.Poll(bctx, 100*time.Millisecond, func() (bool, string) {
			b, _ := os.ReadFile(path)
			return strings.Contains(string(b), readyLine), "no " + readyLine + " in " + path
		}); err != nil {
			return res, err
		}
	}
	select {
	case <-ctx.Done():
		return res, ctx.Err()
	case <-time.After(settle):
	}

	if readErr := res.readShims(d, runtime, n); readErr != nil || runtime != "kvm" {
		return res, readErr
	}
	node, nodeErr := readNodeCost(d, n, daemonsBefore)
	res.Node = &node
	return res, nodeErr
}

// readShims reads the memory of every shim of d, which serve n pods of
// runtime, into res.
func (res *memoryResult) readShims(d *daemon, runtime string, n int) error {
	procs := d.ShimProcesses()
	res.Shims = len(procs)
	if res.Shims != n {
		return fmt.Errorf("%d shim processes for %d pods: %v", res.Shims, n, procs)
	}
	var pss, rss, anon, file int
	for _, p := range procs {
		want := "containerd-shim-" + runtime
		if !strings.Contains(p.Cmdline, want) {
			return fmt.Errorf("shim process %d is not %s: %s", p.Pid, want, p.Cmdline)
		}
		m, err := smapsRollup(p.Pid)
		if err != nil {
			return err
		}
		res.PSSKiB = append(res.PSSKiB, m["Pss"])
		res.RSSKiB = append(res.RSSKiB, m["Rss"])
		res.PSSAnonKiB = append(res.PSSAnonKiB, m["Pss_Anon"])
		res.PSSFileKiB = append(res.PSSFileKiB, m["Pss_File"])
		pss += m["Pss"]
		rss += m["Rss"]
		anon += m["Pss_Anon"]
		file += m["Pss_File"]
	}
	perPod := func(kib int) float64 { return float64(kib) / 1024 / float64(n) }
	res.PSSPerPodMiB, res.RSSPerPodMiB = perPod(pss), perPod(rss)
	res.PSSAnonPerPodMiB, res.PSSFilePerPodMiB = perPod(anon), perPod(file)
	return nil
}

// smapsRollup reads the kB fields of /proc/<pid>/smaps_rollup.
func smapsRollup(pid int) (map[string]int, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseSmapsRollup(bufio.NewScanner(f))
}

func parseSmapsRollup(sc *bufio.Scanner) (map[string]int, error) {
	m := map[string]int{}
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(v)
		if len(fields) != 2 || fields[1] != "kB" {
			continue
		}
		n, err := strconv.Atoi(fields[0])
		if err != nil {
			return nil, fmt.Errorf("smaps_rollup %s: %w", k, err)
		}
		m[k] = n
	}
	if _, ok := m["Pss"]; !ok {
		return nil, errors.New("smaps_rollup has no Pss")
	}
	return m, sc.Err()
}
