package shim

import (
	"context"
	"fmt"
	"os"
	"path"
	"strconv"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kvm-shim/containerd-shim-kvm-v1/cgroup"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// A VM under memory pressure is treated as runc treats a container's
// process: QEMU gets the spec's oomScoreAdj (kubelet's QoS policy:
// BestEffort 1000, Guaranteed -997, Burstable between), so the kernel
// picks the VMs of lower classes first and never the shim (containerd's
// score plus one, set by the shim library at start). A QEMU the kernel's
// OOM killer ended is the container's OOM: TaskOOM, which CRI turns into
// the reason OOMKilled, and exit status 137 (128+SIGKILL), what a runc
// container killed the same way reports.

// oomKilledStatus is a process's exit status after SIGKILL.
const oomKilledStatus = 128 + 9

// checkPodMemory refuses a VM that its pod's cgroup cannot hold. kubelet
// limits the pod's memory to its containers' limits plus the RuntimeClass
// overhead; the guest's RAM is the VM container's limit, so without the
// overhead QEMU itself does not fit and the kernel kills it as the guest
// fills its RAM, again at every restart. Refusing at Create says what to
// declare instead. A pod without a memory limit, or whose cgroup kubelet
// has not made (ctr, CRI clients without kubelet), is not checked.
func checkPodMemory(h *host, cg *cgroup.Group, memMiB int) error {
	if cg == nil || h.cgroups == nil {
		return nil
	}
	pod := path.Dir(cg.Path)
	if pod == "/" {
		return nil
	}
	limit, ok, err := h.cgroups.MemoryLimit(pod)
	if err != nil || !ok {
		return err
	}
	if need := uint64(memMiB+PodFixedOverheadMiB) * mib; limit < need {
		return fmt.Errorf("the pod's memory limit, %d MiB (its containers' limits plus the RuntimeClass overhead), cannot hold the VM's "+
			"%d MiB of guest RAM and QEMU's own %d MiB: declare overhead.podFixed memory: %dMi in the RuntimeClass "+
			"(docs/resources.md): %w", limit/mib, memMiB, PodFixedOverheadMiB, PodFixedOverheadMiB, errdefs.ErrInvalidArgument)
	}
	return nil
}

// oomScoreAdj is the spec's process.oomScoreAdj, or nil.
func oomScoreAdj(spec *specs.Spec) *int {
	if spec == nil || spec.Process == nil {
		return nil
	}
	return spec.Process.OOMScoreAdj
}

// setOOMScoreAdj gives QEMU (pid) the container's score, before its vCPUs
// run; the shim runs as root and QEMU as the VM's own uid, so the kernel
// lets the shim lower it as well as raise it.
func setOOMScoreAdj(pid int, adj *int) error {
	if adj == nil {
		return nil
	}
	p := fmt.Sprintf("/proc/%d/oom_score_adj", pid)
	if err := os.WriteFile(p, []byte(strconv.Itoa(*adj)), 0); err != nil {
		return fmt.Errorf("set QEMU's oom_score_adj to the spec's %d: %w", *adj, err)
	}
	return nil
}

// oomKillsNow reads the VM cgroup's OOM kill count; 0 without a cgroup or
// when it cannot be read (logged: the exit is then reported as libvirt
// gives it).
func (t *vmTask) oomKillsNow(ctx context.Context) uint64 {
	if t.cgroup == nil {
		return 0
	}
	n, err := t.cgroup.OOMKills()
	if err != nil {
		log.G(ctx).WithError(err).WithField("vm", t.rec.Domain).Warn("read the VM cgroup's OOM kill count")
	}
	return n
}

// killedForMemory tells whether a VM that stopped for reason was ended by
// the kernel's OOM killer: QEMU died without a shutdown (libvirt's
// "crashed" or "failed") and its cgroup counted a kill since Start.
func (t *vmTask) killedForMemory(ctx context.Context, reason vm.StopReason) bool {
	if reason != vm.StopCrashed && reason != vm.StopFailed {
		return false
	}
	var before uint64
	withLock(&t.mu, func() { before = t.oomKills })
	return t.oomKillsNow(ctx) > before
}
