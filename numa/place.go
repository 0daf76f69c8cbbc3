package numa

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
)

// tieEpsilon: scores closer than this are equal.
const tieEpsilon = 1e-9

// Place chooses where a VM runs, given the topology, the policy and the
// placements that already exist. It is pure: it reads its arguments and
// changes nothing, and it does not look for r.Owner among current (the
// Store does). Store.Reserve makes the same decision under the
// cross-process lock.
//
// Node mode: a node is eligible when, with the VM added, its floating
// vCPUs ≤ cpu_threshold × its shared CPUs and its guest memory ≤
// mem_threshold × its MemTotal. Among eligible nodes Place picks the
// smallest |CPU ratio − memory ratio| after placement (NodeUsage.CPURatio
// and MemRatio), then the lower CPU ratio + memory ratio, then the lower
// node ID. The VM gets the node's shared CPUs.
//
// Dedicated mode: a node is eligible when it has VCPUs CPUs that are
// usable, not dedicated and not among its MinSharedCPUs housekeeping CPUs,
// when its floating vCPUs still fit cpu_threshold over the shared CPUs
// left, and when its memory fits as above; the same formula picks among
// them. The VM gets the node's highest-numbered free CPUs, one per vCPU,
// and the housekeeping CPUs for its emulator threads.
//
// A VM that no node could hold even empty is rejected, unless it is in
// node mode and the policy allows spreading (see the package doc). Errors
// wrap errdefs.ErrInvalidArgument (bad request or policy) or
// errdefs.ErrResourceExhausted and name the numbers.
func Place(t *Topology, p Policy, current []Placement, r Request) (Placement, error) {
	r, err := r.validate()
	if err != nil {
		return Placement{}, err
	}
	if err := p.Validate(); err != nil {
		return Placement{}, err
	}
	if t == nil || len(t.Nodes) == 0 {
		return Placement{}, fmt.Errorf("place VM %s: topology has no NUMA nodes: %w", r.Owner, errdefs.ErrInvalidArgument)
	}
	return newLedger(t, p.WithDefaults(), current).decide(r)
}

// decide is Place on a ledger, for a validated request.
func (l *ledger) decide(r Request) (Placement, error) {
	if r.Mode == ModeNone {
		return Placement{Owner: r.Owner, Mode: ModeNone, VCPUs: r.VCPUs, MemoryMiB: r.MemoryMiB}, nil
	}
	best, _ := l.best(r.Mode, r.VCPUs, int64(r.MemoryMiB), 1, nil)
	if len(best) == 1 {
		return l.placeOn(best[0], r), nil
	}
	if l.fitsEmpty(r.Mode, r.VCPUs, int64(r.MemoryMiB)) {
		return Placement{}, fmt.Errorf("no NUMA node has room for VM %s (%s): %s: %w",
			r.Owner, describeRequest(r), l.reasons(r.Mode, r.VCPUs, int64(r.MemoryMiB)), errdefs.ErrResourceExhausted)
	}
	if r.Mode == ModeNode && l.p.AllowSpread {
		return l.spread(r)
	}
	return Placement{}, l.tooLarge(r)
}

// fit reports whether the node can take vcpus and memMiB more in the mode,
// and the node's imbalance and load if it did.
func (l *ledger) fit(n *nodeLoad, mode Mode, vcpus int, memMiB int64) (ok bool, score, load float64) {
	usable := len(n.usable)
	if usable == 0 || n.node.MemoryBytes == 0 {
		return false, 0, 0
	}
	shared := usable - n.ded
	floating := n.vcpus
	switch mode {
	case ModeDedicated:
		if vcpus > usable-n.housekeeping-n.ded {
			return false, 0, 0
		}
		shared -= vcpus
	default:
		floating += vcpus
	}
	if !within(float64(floating), l.p.CPUThreshold*float64(shared)) {
		return false, 0, 0
	}
	memBytes := float64((n.memMiB + memMiB) * mib)
	if !within(memBytes, l.p.MemThreshold*float64(n.node.MemoryBytes)) {
		return false, 0, 0
	}
	cpuRatio := float64(n.vcpus+n.ded+vcpus) / float64(usable)
	memRatio := memBytes / float64(n.node.MemoryBytes)
	return true, math.Abs(cpuRatio - memRatio), cpuRatio + memRatio
}

// best returns the indexes of the k nodes that fit the VM (or a share of
// it) best: by imbalance, then load, then node ID; or, when near is set,
// by distance to the node near[0] first. fewer than k means not enough fit.
func (l *ledger) best(mode Mode, vcpus int, memMiB int64, k int, near *Node) ([]int, int) {
	type cand struct {
		i           int
		dist        int
		score, load float64
	}
	var cands []cand
	var bestOne cand
	fits := 0
	for i := range l.nodes {
		ok, score, load := l.fit(&l.nodes[i], mode, vcpus, memMiB)
		if !ok {
			continue
		}
		c := cand{i: i, score: score, load: load}
		if near != nil && near.Distances != nil {
			c.dist = near.Distances[i]
		}
		fits++
		if k == 1 {
			if fits == 1 || better(c.score, c.load, bestOne.score, bestOne.load) {
				bestOne = c
			}
			continue
		}
		cands = append(cands, c)
	}
	if k == 1 {
		if fits == 0 {
			return nil, 0
		}
		return []int{bestOne.i}, fits
	}
	slices.SortStableFunc(cands, func(a, b cand) int {
		if a.dist != b.dist {
			return cmp.Compare(a.dist, b.dist)
		}
		switch {
		case better(a.score, a.load, b.score, b.load):
			return -1
		case better(b.score, b.load, a.score, a.load):
			return 1
		}
		return cmp.Compare(a.i, b.i)
	})
	out := make([]int, 0, k)
	for _, c := range cands[:min(k, len(cands))] {
		out = append(out, c.i)
	}
	return out, fits
}

// better: smaller imbalance, then smaller load; equal otherwise (the
// caller's scan order, ascending node ID, breaks the tie).
func better(score, load, bestScore, bestLoad float64) bool {
	if math.Abs(score-bestScore) > tieEpsilon {
		return score < bestScore
	}
	return load < bestLoad-tieEpsilon
}

func (l *ledger) placeOn(i int, r Request) Placement {
	n := &l.nodes[i]
	pl := Placement{Owner: r.Owner, Mode: r.Mode, VCPUs: r.VCPUs, MemoryMiB: r.MemoryMiB, Nodes: []int{n.node.ID}}
	if r.Mode != ModeDedicated {
		pl.CPUs = l.shared(n)
		return pl
	}
	// Carve from the end of the node's list: the housekeeping CPUs at its
	// start stay shared.
	cpus := make([]int, 0, r.VCPUs)
	for j := len(n.usable) - 1; j >= n.housekeeping && len(cpus) < r.VCPUs; j-- {
		if c := n.usable[j]; !l.dedicated[c] {
			cpus = append(cpus, c)
		}
	}
	slices.Reverse(cpus)
	pl.CPUs = cpus
	pl.VCPUPins = slices.Clone(cpus)
	pl.EmulatorCPUs = slices.Clone(n.usable[:n.housekeeping])
	return pl
}

// capacity is what an empty node could take in the mode: vCPUs and bytes.
func (l *ledger) capacity(n *nodeLoad, mode Mode) (vcpus int, memBytes float64) {
	memBytes = l.p.MemThreshold * float64(n.node.MemoryBytes)
	if len(n.usable) == 0 || n.node.MemoryBytes == 0 {
		return 0, 0
	}
	if mode == ModeDedicated {
		return len(n.usable) - n.housekeeping, memBytes
	}
	return int(math.Floor(l.p.CPUThreshold * float64(len(n.usable)) * (1 + 1e-9))), memBytes
}

func (l *ledger) fitsEmpty(mode Mode, vcpus int, memMiB int64) bool {
	for i := range l.nodes {
		c, m := l.capacity(&l.nodes[i], mode)
		if vcpus <= c && within(float64(memMiB*mib), m) {
			return true
		}
	}
	return false
}

// spread places a node-mode VM larger than any node on the fewest nodes
// that can hold it in near-equal shares, one guest NUMA cell per node.
func (l *ledger) spread(r Request) (Placement, error) {
	smallest := 0 // fewest nodes that could hold the VM were they empty
	for k := 2; k <= len(l.nodes) && k <= r.VCPUs && k <= r.MemoryMiB; k++ {
		vShare, mShare := share(r.VCPUs, k, 0), int64(share(r.MemoryMiB, k, 0))
		if !l.fitsEmptyK(vShare, mShare, k) {
			continue
		}
		if smallest == 0 {
			smallest = k
		}
		first, fits := l.best(ModeNode, vShare, mShare, 1, nil)
		if fits < k {
			continue // not enough room now; smaller shares may find it
		}
		chosen, _ := l.best(ModeNode, vShare, mShare, k, l.nodes[first[0]].node)
		slices.Sort(chosen) // cells in host node order
		pl := Placement{Owner: r.Owner, Mode: ModeNode, VCPUs: r.VCPUs, MemoryMiB: r.MemoryMiB}
		vcpu := 0
		for j, i := range chosen {
			n := &l.nodes[i]
			g := GuestNode{HostNode: n.node.ID, MemoryMiB: share(r.MemoryMiB, k, j), CPUs: l.shared(n)}
			for range share(r.VCPUs, k, j) {
				g.VCPUs = append(g.VCPUs, vcpu)
				vcpu++
			}
			pl.Nodes = append(pl.Nodes, n.node.ID)
			pl.CPUs = append(pl.CPUs, g.CPUs...)
			pl.GuestNodes = append(pl.GuestNodes, g)
		}
		slices.Sort(pl.CPUs)
		return pl, nil
	}
	if smallest == 0 {
		return Placement{}, l.tooLarge(r)
	}
	vShare, mShare := share(r.VCPUs, smallest, 0), int64(share(r.MemoryMiB, smallest, 0))
	return Placement{}, fmt.Errorf("VM %s (%s) is larger than any NUMA node and no %d nodes have room for a share of %d vCPUs and %s each: "+
		"%s: %w",
		r.Owner, describeRequest(r), smallest, vShare, formatMiB(mShare), l.reasons(ModeNode, vShare, mShare), errdefs.ErrResourceExhausted)
}

// fitsEmptyK: at least k nodes could each take a share when empty.
func (l *ledger) fitsEmptyK(vShare int, mShare int64, k int) bool {
	n := 0
	for i := range l.nodes {
		c, m := l.capacity(&l.nodes[i], ModeNode)
		if vShare <= c && within(float64(mShare*mib), m) {
			n++
		}
	}
	return n >= k
}

// tooLarge explains why no single empty node could hold the VM.
func (l *ledger) tooLarge(r Request) error {
	maxV, maxVNode := 0, -1
	maxM, maxMNode := 0.0, -1
	for i := range l.nodes {
		c, m := l.capacity(&l.nodes[i], r.Mode)
		if maxVNode < 0 || c > maxV {
			maxV, maxVNode = c, i
		}
		if maxMNode < 0 || m > maxM {
			maxM, maxMNode = m, i
		}
	}
	var msg string
	switch vn, mn := &l.nodes[maxVNode], &l.nodes[maxMNode]; {
	case r.Mode == ModeDedicated && r.VCPUs > maxV:
		msg = fmt.Sprintf("dedicated VM %s needs %d CPUs but the largest NUMA node can dedicate %d (%d usable CPUs, min_shared_cpus %d kept "+
			"shared)",
			r.Owner, r.VCPUs, maxV, len(vn.usable), vn.housekeeping)
	case r.VCPUs > maxV:
		msg = fmt.Sprintf("VM %s needs %d vCPUs but the largest NUMA node takes %d (%d usable CPUs × cpu_threshold %g)",
			r.Owner, r.VCPUs, maxV, len(vn.usable), l.p.CPUThreshold)
	case !within(float64(int64(r.MemoryMiB)*mib), maxM):
		msg = fmt.Sprintf("VM %s needs %s but the largest NUMA node has %s", r.Owner, formatMiB(int64(r.MemoryMiB)),
			formatBytes(float64(mn.node.MemoryBytes)))
		if l.p.MemThreshold != 1 {
			msg += fmt.Sprintf(" (mem_threshold %g allows %s)", l.p.MemThreshold, formatBytes(maxM))
		}
	default:
		msg = fmt.Sprintf("VM %s (%s) fits no single NUMA node: the nodes with enough CPUs lack the memory and the reverse", r.Owner,
			describeRequest(r))
	}
	switch {
	case r.Mode == ModeNode && !l.p.AllowSpread:
		msg += "; allow_spread would spread it over several nodes"
	case r.Mode == ModeNode:
		msg += fmt.Sprintf(", and even spread over all %d nodes it does not fit", len(l.nodes))
	}
	return fmt.Errorf("%s: %w", msg, errdefs.ErrResourceExhausted)
}

// reasons says, node by node, why the VM does not fit there now.
func (l *ledger) reasons(mode Mode, vcpus int, memMiB int64) string {
	var parts []string
	for i := range l.nodes {
		n := &l.nodes[i]
		var why []string
		usable, shared := len(n.usable), len(n.usable)-n.ded
		c, m := l.capacity(n, mode)
		switch {
		case usable == 0 || n.node.MemoryBytes == 0:
			why = append(why, "no usable CPUs or memory")
		case vcpus > c || !within(float64(memMiB*mib), m):
			why = append(why, "too small")
		default:
			if mode == ModeDedicated {
				if free := usable - n.housekeeping - n.ded; vcpus > free {
					why = append(why, fmt.Sprintf("%d CPUs left to dedicate", free))
				} else if !within(float64(n.vcpus), l.p.CPUThreshold*float64(shared-vcpus)) {
					why = append(why,
						fmt.Sprintf("its %d floating vCPUs would exceed %d shared CPUs × cpu_threshold %g", n.vcpus, shared-vcpus, l.p.CPUThreshold))
				}
			} else if !within(float64(n.vcpus+vcpus), l.p.CPUThreshold*float64(shared)) {
				why = append(why, fmt.Sprintf("%d floating vCPUs on %d shared CPUs (cpu_threshold %g)", n.vcpus, shared, l.p.CPUThreshold))
			}
			if !within(float64((n.memMiB+memMiB)*mib), m) {
				why = append(why,
					fmt.Sprintf("%s of %s allocated (mem_threshold %g)", formatMiB(n.memMiB), formatBytes(float64(n.node.MemoryBytes)), l.p.MemThreshold))
			}
		}
		parts = append(parts, fmt.Sprintf("node %d: %s", n.node.ID, strings.Join(why, ", ")))
	}
	return strings.Join(parts, "; ")
}

func describeRequest(r Request) string {
	return fmt.Sprintf("%d vCPUs, %s, mode %s", r.VCPUs, formatMiB(int64(r.MemoryMiB)), r.Mode)
}

// formatMiB prints whole GiB as "64 GiB", anything else in MiB.
func formatMiB(m int64) string {
	if m != 0 && m%1024 == 0 {
		return fmt.Sprintf("%d GiB", m/1024)
	}
	return fmt.Sprintf("%d MiB", m)
}

// formatBytes prints a node size: "32 GiB", "31.4 GiB".
func formatBytes(b float64) string {
	g := b / (1 << 30)
	if g == math.Trunc(g) {
		return fmt.Sprintf("%.0f GiB", g)
	}
	return fmt.Sprintf("%.1f GiB", g)
}
