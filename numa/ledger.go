package numa

import (
	"math"
	"slices"
)

const mib = 1 << 20

// ledger is what the current placements hold on each node of a topology,
// under a policy: the arithmetic shared by Place and Usage.
type ledger struct {
	p     Policy // with defaults
	nodes []nodeLoad
	// dedicated marks every CPU held by a dedicated VM, by CPU number.
	dedicated []bool
}

type nodeLoad struct {
	node *Node
	// usable are the node's CPUs minus Policy.ReservedCPUs, ascending.
	usable []int
	// housekeeping: usable[:housekeeping] are never dedicated.
	housekeeping int
	// ded counts the usable CPUs held by dedicated VMs.
	ded int
	// vcpus counts floating vCPUs: node-mode VMs and spread VMs' cells.
	vcpus int
	// memMiB is the guest memory of every VM on the node.
	memMiB int64
	vms    int
}

func newLedger(t *Topology, p Policy, current []Placement) *ledger {
	maxCPU := 0
	for _, n := range t.Nodes {
		if len(n.CPUs) > 0 {
			maxCPU = max(maxCPU, n.CPUs[len(n.CPUs)-1])
		}
	}
	l := &ledger{p: p, nodes: make([]nodeLoad, len(t.Nodes)), dedicated: make([]bool, maxCPU+1)}
	reserved := l.dedicated // borrowed as scratch before any CPU is dedicated
	for _, c := range p.ReservedCPUs {
		if c <= maxCPU {
			reserved[c] = true
		}
	}
	for i := range t.Nodes {
		n := &t.Nodes[i]
		usable := n.CPUs
		if len(p.ReservedCPUs) > 0 {
			usable = make([]int, 0, len(n.CPUs))
			for _, c := range n.CPUs {
				if !reserved[c] {
					usable = append(usable, c)
				}
			}
		}
		l.nodes[i] = nodeLoad{node: n, usable: usable, housekeeping: min(p.MinSharedCPUs, len(usable))}
	}
	clear(reserved)
	for i := range current {
		l.charge(&current[i])
	}
	return l
}

// newLedgerFromSummary is newLedger for the placements that sums
// summarise: what the Store decides on without decoding every placement.
func newLedgerFromSummary(t *Topology, p Policy, sums []nodeSummary) *ledger {
	l := newLedger(t, p, nil)
	for _, s := range sums {
		i := l.index(s.Node)
		if i < 0 {
			continue
		}
		n := &l.nodes[i]
		n.vcpus += s.VCPUs
		n.memMiB += s.MemoryMiB
		n.vms += s.VMs
		for _, c := range s.Dedicated {
			if _, ok := slices.BinarySearch(n.usable, c); ok && !l.dedicated[c] {
				l.dedicated[c] = true
				n.ded++
			}
		}
	}
	return l
}

func (l *ledger) index(id int) int {
	for i := range l.nodes {
		if l.nodes[i].node.ID == id {
			return i
		}
	}
	return -1
}

// charge adds a placement's use to its nodes. Node IDs and CPUs the
// topology does not have (it changed since) are ignored, as is a CPU
// claimed twice.
func (l *ledger) charge(pl *Placement) {
	switch pl.Mode {
	case ModeDedicated:
		if len(pl.Nodes) == 0 {
			return
		}
		i := l.index(pl.Nodes[0])
		if i < 0 {
			return
		}
		n := &l.nodes[i]
		for _, c := range pl.CPUs {
			if _, ok := slices.BinarySearch(n.usable, c); ok && !l.dedicated[c] {
				l.dedicated[c] = true
				n.ded++
			}
		}
		n.memMiB += int64(pl.MemoryMiB)
		n.vms++
	case ModeNode, "":
		if len(pl.GuestNodes) > 0 {
			for _, g := range pl.GuestNodes {
				l.chargeFloating(g.HostNode, len(g.VCPUs), int64(g.MemoryMiB))
			}
			return
		}
		k := len(pl.Nodes)
		for j, id := range pl.Nodes {
			l.chargeFloating(id, share(pl.VCPUs, k, j), int64(share(pl.MemoryMiB, k, j)))
		}
	}
}

func (l *ledger) chargeFloating(id, vcpus int, memMiB int64) {
	if i := l.index(id); i >= 0 {
		n := &l.nodes[i]
		n.vcpus += vcpus
		n.memMiB += memMiB
		n.vms++
	}
}

// share is part j of total split into k near-equal parts, larger first.
func share(total, k, j int) int {
	s := total / k
	if j < total%k {
		s++
	}
	return s
}

// shared lists the node's usable CPUs that no VM holds exclusively.
func (l *ledger) shared(n *nodeLoad) []int {
	out := make([]int, 0, len(n.usable)-n.ded)
	for _, c := range n.usable {
		if !l.dedicated[c] {
			out = append(out, c)
		}
	}
	return out
}

// ratio is a/b, with 0/0 = 0 and x/0 = +Inf.
func ratio(a, b float64) float64 {
	if b == 0 {
		if a == 0 {
			return 0
		}
		return math.Inf(1)
	}
	return a / b
}

// within reports a <= limit with room for floating-point error in limit
// (0.29*100 is 28.999999999999996).
func within(a, limit float64) bool { return a <= limit*(1+1e-9) }

// NodeUsage is what the placements hold on one node.
type NodeUsage struct {
	Node int
	// UsableCPUs is the node's CPU count minus Policy.ReservedCPUs.
	UsableCPUs int
	// SharedCPUs are the usable CPUs no VM holds exclusively: node-mode
	// VMs placed now float over them.
	SharedCPUs []int
	// DedicatedCPUs are held by dedicated VMs.
	DedicatedCPUs []int
	// VCPUs counts floating vCPUs (node mode and spread cells).
	VCPUs int
	// MemoryMiB is the guest memory of every VM on the node;
	// MemoryBytes is the node's MemTotal.
	MemoryMiB   int64
	MemoryBytes uint64
	VMs         int
	// CPURatio = (VCPUs + len(DedicatedCPUs)) / UsableCPUs: how much of
	// the node's CPU is allocated; the balance formula compares it with
	// MemRatio. Without dedicated VMs it equals SharedRatio.
	CPURatio float64
	// SharedRatio = VCPUs / len(SharedCPUs): the overcommit of the shared
	// CPUs, kept at or below cpu_threshold.
	SharedRatio float64
	// MemRatio = MemoryMiB / MemoryBytes, kept at or below mem_threshold.
	MemRatio float64
}

// Imbalance is |CPURatio − MemRatio|, what placement minimises.
func (u NodeUsage) Imbalance() float64 { return math.Abs(u.CPURatio - u.MemRatio) }

// Usage returns, per node of t in order, what the placements ps hold
// under policy p (ReservedCPUs and MinSharedCPUs matter). ModeNone
// placements count nowhere; nodes the topology no longer has are ignored.
func Usage(t *Topology, p Policy, ps []Placement) []NodeUsage {
	l := newLedger(t, p.WithDefaults(), ps)
	out := make([]NodeUsage, len(l.nodes))
	for i := range l.nodes {
		n := &l.nodes[i]
		u := NodeUsage{
			Node:        n.node.ID,
			UsableCPUs:  len(n.usable),
			SharedCPUs:  l.shared(n),
			VCPUs:       n.vcpus,
			MemoryMiB:   n.memMiB,
			MemoryBytes: n.node.MemoryBytes,
			VMs:         n.vms,
		}
		for _, c := range n.usable {
			if l.dedicated[c] {
				u.DedicatedCPUs = append(u.DedicatedCPUs, c)
			}
		}
		u.CPURatio = ratio(float64(n.vcpus+n.ded), float64(len(n.usable)))
		u.SharedRatio = ratio(float64(n.vcpus), float64(len(u.SharedCPUs)))
		u.MemRatio = ratio(float64(n.memMiB*mib), float64(n.node.MemoryBytes))
		out[i] = u
	}
	return out
}

// Overlap is a VM whose CPUs include CPUs dedicated to another VM.
type Overlap struct {
	// Owner's CPUs include CPUs of DedicatedTo's exclusive set.
	Owner       string
	DedicatedTo string
	CPUs        []int
	// Stale: Owner is a node-mode VM placed before DedicatedTo. Its CPU
	// set was fixed at placement and is not re-pinned (see the package
	// doc); re-pinning it to its node's current shared CPUs resolves it.
	// Any other overlap (two dedicated VMs, or a VM placed after the
	// dedicated one) breaks an invariant and should never be seen.
	Stale bool
}

// Overlaps lists the VMs in ps (in placement order, as the Store keeps
// them) whose CPUs include CPUs dedicated to another VM. The store never
// creates such overlaps except the stale ones; `check` prints them.
func Overlaps(ps []Placement) []Overlap {
	var out []Overlap
	for d := range ps {
		if ps[d].Mode != ModeDedicated {
			continue
		}
		for o := range ps {
			if o == d || ps[o].Mode == ModeNone {
				continue
			}
			var common []int
			for _, c := range ps[o].CPUs {
				if slices.Contains(ps[d].CPUs, c) {
					common = append(common, c)
				}
			}
			if len(common) == 0 || (ps[o].Mode == ModeDedicated && o < d) {
				continue // a pair of dedicated VMs is reported once
			}
			out = append(out, Overlap{
				Owner:       ps[o].Owner,
				DedicatedTo: ps[d].Owner,
				CPUs:        common,
				Stale:       ps[o].Mode != ModeDedicated && o < d,
			})
		}
	}
	return out
}
