package numa

import (
	"fmt"
	"math"

	"github.com/containerd/errdefs"
)

// VCPUResource is the node's extended resource that carries VCPUCapacity
// to Kubernetes: the node installer advertises it in the node's status,
// the RuntimeClass's overhead charges every VM pod one, and a pod whose
// VM has more vCPUs requests the rest in its container's resources. The
// scheduler and kubelet then admit no more floating vCPUs than Place
// does.
const VCPUResource = "kvm.containerd.io/vcpu"

// VCPUCapacity is how many floating vCPUs (mode node) the host takes
// under the policy with no VM placed: per NUMA node ⌊cpu_threshold ×
// usable CPUs⌋ (the very bound Place checks a node against), summed over
// the nodes. A host with one NUMA node admits exactly this many vCPUs of
// node-mode VMs of any sizes; a host with several admits exactly this
// many 1-vCPU VMs, while larger VMs must each fit one node (or spread).
// Memory-only nodes and nodes whose CPUs are all reserved add nothing.
func VCPUCapacity(t *Topology, p Policy) (int, error) {
	if err := t.Validate(); err != nil {
		return 0, err
	}
	if err := p.Validate(); err != nil {
		return 0, err
	}
	l := newLedger(t, p.WithDefaults(), nil)
	total := 0
	for i := range l.nodes {
		c, _ := l.capacity(&l.nodes[i], ModeNode)
		total += c
	}
	return total, nil
}

// VCPUSlots is how many of VCPUCapacity a VM of the mode and vCPUs
// takes: its vCPUs in mode node; in mode dedicated ⌈cpu_threshold⌉ per
// vCPU, since each dedicated CPU leaves the node's floating vCPUs
// cpu_threshold fewer shared CPUs; none in mode none, which Place counts
// nowhere (the RuntimeClass's overhead still charges it one).
func VCPUSlots(p Policy, mode Mode, vcpus int) (int, error) {
	if err := p.Validate(); err != nil {
		return 0, err
	}
	if vcpus < 1 || vcpus > maxCPUID {
		return 0, fmt.Errorf("vcpus must be from 1 to %d, got %d: %w", maxCPUID, vcpus, errdefs.ErrInvalidArgument)
	}
	switch mode {
	case ModeNode, "":
		return vcpus, nil
	case ModeDedicated:
		return vcpus * int(math.Ceil(p.WithDefaults().CPUThreshold-1e-9)), nil
	case ModeNone:
		return 0, nil
	}
	_, err := ParseMode(string(mode))
	return 0, err
}
