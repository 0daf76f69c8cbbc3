package numa

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// vm is a node-mode placement already on node id, for building "current".
func vm(owner string, node, vcpus, memGiB int) Placement {
	return Placement{Owner: owner, Mode: ModeNode, VCPUs: vcpus, MemoryMiB: memGiB * 1024, Nodes: []int{node}}
}

func req(owner string, vcpus, memGiB int) Request {
	return Request{Owner: owner, VCPUs: vcpus, MemoryMiB: memGiB * 1024}
}

func TestPlaceChoosesNode(t *testing.T) {
	two := uniform(2, 8, 32)
	for _, tc := range []struct {
		name     string
		nodes    []fakeNode
		policy   Policy
		current  []Placement
		req      Request
		wantNode int
	}{
		{"empty host: tie on everything, lowest id", two, Policy{}, nil, req("a", 2, 8), 0},
		{"equal imbalance: the less loaded node", two, Policy{}, []Placement{vm("x", 0, 2, 8)}, req("a", 1, 4), 1},
		// node 0 is CPU-heavy (0.5 vs 0.125): a memory-heavy VM evens it
		// out (0.625 vs 0.5) better than it would node 1 (0.125 vs 0.375),
		// though node 0 is the busier one.
		{"formula over load: memory-heavy VM evens out a CPU-heavy node", two, Policy{}, []Placement{vm("x", 0, 4, 4)}, req("a", 1, 12), 0},
		// node 0 is memory-heavy (0.125 vs 0.5): adding memory there makes
		// it worse (0.25 vs 0.75); node 1 stays closer (0.125 vs 0.25).
		{"formula: memory-heavy VM avoids a memory-heavy node", two, Policy{}, []Placement{vm("x", 0, 1, 16)}, req("a", 1, 8), 1},
		{"cpu_threshold excludes the formula's favourite", two, Policy{CPUThreshold: 1},
			[]Placement{vm("x", 0, 7, 1)}, req("a", 2, 28), 1},
		{"same but overcommit allowed", two, Policy{CPUThreshold: 2},
			[]Placement{vm("x", 0, 7, 1)}, req("a", 2, 28), 0},
		{"mem_threshold excludes the formula's favourite", two, Policy{MemThreshold: 0.5},
			[]Placement{vm("x", 0, 4, 1)}, req("a", 1, 16), 1},
		{"same without the threshold", two, Policy{},
			[]Placement{vm("x", 0, 4, 1)}, req("a", 1, 16), 0},
		{"uneven nodes: ratios are per node size",
			[]fakeNode{{"0-3", 64}, {"4-19", 16}}, Policy{}, nil, req("a", 1, 8), 0},
		{"uneven nodes: a CPU-heavy VM goes to the CPU-rich node",
			[]fakeNode{{"0-3", 64}, {"4-19", 16}}, Policy{}, nil, req("a", 4, 2), 1},
		{"4 nodes: the only balanced choice",
			uniform(4, 16, 128), Policy{}, []Placement{vm("w", 0, 16, 16), vm("x", 1, 1, 100), vm("y", 2, 8, 8), vm("z", 3, 8, 64)},
			req("a", 2, 16), 3},
		{"8 nodes: ties on imbalance, lowest load wins",
			uniform(8, 8, 64), Policy{}, []Placement{vm("w", 0, 1, 8), vm("x", 1, 1, 8), vm("y", 3, 2, 16), vm("z", 5, 1, 8),
				vm("u", 2, 1, 8), vm("v", 4, 1, 8), vm("s", 6, 1, 8)},
			req("a", 1, 8), 7},
		{"reserved CPUs shrink a node", two, Policy{ReservedCPUs: []int{0, 1, 2, 3}}, []Placement{vm("x", 1, 2, 8)}, req("a", 2, 8), 1},
		{"same without reserved CPUs", two, Policy{}, []Placement{vm("x", 1, 2, 8)}, req("a", 2, 8), 0},
		{"reserved CPUs are not in the VM's set", two, Policy{ReservedCPUs: []int{0, 1, 2, 3}}, nil, req("a", 1, 16), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topo := fakeTopology(t, tc.nodes)
			pl, err := Place(topo, tc.policy, tc.current, tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(pl.Nodes, []int{tc.wantNode}) {
				t.Fatalf("placed on %v, want node %d; usage before: %+v", pl.Nodes, tc.wantNode, Usage(topo, tc.policy, tc.current))
			}
			n, _ := topo.Node(tc.wantNode)
			wantCPUs := slices.DeleteFunc(slices.Clone(n.CPUs), func(c int) bool { return slices.Contains(tc.policy.ReservedCPUs, c) })
			if !slices.Equal(pl.CPUs, wantCPUs) || pl.Mode != ModeNode || pl.VCPUPins != nil || pl.GuestNodes != nil {
				t.Errorf("placement %+v, want node mode floating over %v", pl, wantCPUs)
			}
		})
	}
}

// Equal VMs arriving one by one on identical nodes spread round-robin:
// after each arrival no node holds two more than another.
func TestPlaceKeepsNodesEven(t *testing.T) {
	for _, n := range []int{1, 2, 4, 8} {
		topo := fakeTopology(t, uniform(n, 8, 64))
		var ps []Placement
		for i := range 8 * n {
			pl, err := Place(topo, Policy{}, ps, req(fmt.Sprint("vm", i), 2, 8))
			if err != nil {
				t.Fatalf("%d nodes, vm %d: %v", n, i, err)
			}
			ps = append(ps, pl)
			counts := make([]int, n)
			for _, u := range Usage(topo, Policy{}, ps) {
				counts[u.Node] = u.VMs
			}
			if slices.Max(counts)-slices.Min(counts) > 1 {
				t.Fatalf("%d nodes after %d VMs: VMs per node %v", n, i+1, counts)
			}
		}
		// The host is now full on memory: the next one is rejected.
		if _, err := Place(topo, Policy{}, ps, req("more", 1, 8)); !errdefs.IsResourceExhausted(err) {
			t.Errorf("%d nodes full: err = %v", n, err)
		}
	}
}

func TestPlaceThresholdsAreInclusive(t *testing.T) {
	topo := fakeTopology(t, uniform(1, 4, 8))
	// Exactly at both thresholds fits; one more vCPU or MiB does not.
	if _, err := Place(topo, Policy{CPUThreshold: 2}, nil, Request{Owner: "a", VCPUs: 8, MemoryMiB: 8192}); err != nil {
		t.Errorf("at the thresholds: %v", err)
	}
	for _, r := range []Request{{Owner: "a", VCPUs: 9, MemoryMiB: 1}, {Owner: "a", VCPUs: 1, MemoryMiB: 8193}} {
		if _, err := Place(topo, Policy{CPUThreshold: 2}, nil, r); !errdefs.IsResourceExhausted(err) {
			t.Errorf("%+v over a threshold: err = %v", r, err)
		}
	}
	// A fractional threshold whose product is not exact in floating point.
	topo = fakeTopology(t, uniform(1, 100, 8))
	if _, err := Place(topo, Policy{CPUThreshold: 0.29}, nil, Request{Owner: "a", VCPUs: 29, MemoryMiB: 1}); err != nil {
		t.Errorf("29 vCPUs on 100 CPUs × 0.29: %v", err)
	}
}

func TestPlaceDedicated(t *testing.T) {
	topo := fakeTopology(t, []fakeNode{{"0-7", 32}, {"8-11", 32}})
	p := Policy{CPUThreshold: 1}
	var ps []Placement
	place := func(r Request) Placement {
		t.Helper()
		pl, err := Place(topo, p, ps, r)
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, pl)
		return pl
	}
	d1 := place(Request{Owner: "d1", VCPUs: 3, MemoryMiB: 1024, Mode: ModeDedicated})
	// Node 0 balances best (3/8 CPU vs 1/32 memory beats 3/4 vs 1/32);
	// CPUs come from the end of its list, the first CPU stays shared.
	want := Placement{Owner: "d1", Mode: ModeDedicated, VCPUs: 3, MemoryMiB: 1024, Nodes: []int{0},
		CPUs: []int{5, 6, 7}, VCPUPins: []int{5, 6, 7}, EmulatorCPUs: []int{0}}
	if !reflect.DeepEqual(d1, want) {
		t.Fatalf("d1 = %+v, want %+v", d1, want)
	}
	n1 := place(Request{Owner: "n1", VCPUs: 4, MemoryMiB: 1024})
	if !slices.Equal(n1.Nodes, []int{0}) || !slices.Equal(n1.CPUs, []int{0, 1, 2, 3, 4}) {
		t.Fatalf("node-mode VM after d1: %+v, want node 0 without d1's CPUs", n1)
	}
	d2 := place(Request{Owner: "d2", VCPUs: 3, MemoryMiB: 1024, Mode: ModeDedicated})
	if !slices.Equal(d2.CPUs, []int{9, 10, 11}) || !slices.Equal(d2.EmulatorCPUs, []int{8}) {
		t.Fatalf("d2 = %+v: want node 1's last three CPUs", d2)
	}
	// Node 0 has 4 floating vCPUs on 5 shared CPUs: dedicating 1 more
	// leaves 4 shared, still within cpu_threshold 1; 2 more would not.
	d3 := place(Request{Owner: "d3", VCPUs: 1, MemoryMiB: 1024, Mode: ModeDedicated})
	if !slices.Equal(d3.CPUs, []int{4}) {
		t.Fatalf("d3 = %+v, want CPU 4", d3)
	}
	_, err := Place(topo, p, ps, Request{Owner: "d4", VCPUs: 1, MemoryMiB: 1024, Mode: ModeDedicated})
	for _, want := range []string{"no NUMA node has room for VM d4", "node 0: its 4 floating vCPUs would exceed 3 shared CPUs",
		"node 1: 0 CPUs left to dedicate"} {
		if !errdefs.IsResourceExhausted(err) || !strings.Contains(fmt.Sprint(err), want) {
			t.Errorf("d4: err = %v, want it to say %q", err, want)
		}
	}
	// Releasing d1 frees its CPUs for the next dedicated VM.
	ps = slices.DeleteFunc(ps, func(pl Placement) bool { return pl.Owner == "d1" })
	d5 := place(Request{Owner: "d5", VCPUs: 2, MemoryMiB: 1024, Mode: ModeDedicated})
	if !slices.Equal(d5.CPUs, []int{6, 7}) {
		t.Errorf("d5 = %+v, want d1's old CPUs 6-7", d5)
	}
	assertExclusive(t, ps)
	// n1 was placed before d3: its CPU set is stale, and Overlaps says so.
	o := Overlaps(ps)
	if len(o) != 1 || o[0].Owner != "n1" || o[0].DedicatedTo != "d3" || !o[0].Stale || !slices.Equal(o[0].CPUs, []int{4}) {
		t.Errorf("Overlaps = %+v, want n1's stale CPU 4 of d3", o)
	}
}

// assertExclusive checks, from the placements alone, that no CPU is
// dedicated twice, that no emulator CPU is dedicated, and that no VM
// placed after a dedicated one runs on its CPUs.
func assertExclusive(t *testing.T, ps []Placement) {
	t.Helper()
	if err := exclusivityViolation(ps); err != nil {
		t.Error(err)
	}
}

func exclusivityViolation(ps []Placement) error {
	owner := map[int]string{}
	for _, pl := range ps {
		if pl.Mode != ModeDedicated {
			continue
		}
		if len(pl.CPUs) != pl.VCPUs || !slices.Equal(pl.CPUs, pl.VCPUPins) {
			return fmt.Errorf("%s: %d vCPUs on CPUs %v pinned %v", pl.Owner, pl.VCPUs, pl.CPUs, pl.VCPUPins)
		}
		for _, c := range pl.CPUs {
			if o, dup := owner[c]; dup {
				return fmt.Errorf("CPU %d dedicated to both %s and %s", c, o, pl.Owner)
			}
			owner[c] = pl.Owner
		}
	}
	for j, pl := range ps {
		for _, c := range pl.EmulatorCPUs {
			if o, ok := owner[c]; ok {
				return fmt.Errorf("%s's emulator CPU %d is dedicated to %s", pl.Owner, c, o)
			}
		}
		if pl.Mode == ModeDedicated {
			continue
		}
		for i := range j {
			if ps[i].Mode != ModeDedicated {
				continue
			}
			for _, c := range pl.CPUs {
				if slices.Contains(ps[i].CPUs, c) {
					return fmt.Errorf("%s, placed after dedicated %s, runs on its CPU %d", pl.Owner, ps[i].Owner, c)
				}
			}
		}
	}
	return nil
}

func TestPlaceDedicatedFillsEveryNodeExclusively(t *testing.T) {
	for _, nodes := range [][]fakeNode{uniform(1, 4, 8), uniform(2, 6, 8), uniform(4, 5, 8), uniform(8, 3, 8),
		{{"0-2", 8}, {"3-12", 8}, {"13-14", 8}, {"15", 8}}} {
		topo := fakeTopology(t, nodes)
		var ps []Placement
		for i := 0; ; i++ {
			pl, err := Place(topo, Policy{}, ps, Request{Owner: fmt.Sprint("d", i), VCPUs: 1 + i%2, MemoryMiB: 1, Mode: ModeDedicated})
			if err != nil {
				if !errdefs.IsResourceExhausted(err) {
					t.Fatal(err)
				}
				break
			}
			ps = append(ps, pl)
		}
		assertExclusive(t, ps)
		// Every node keeps exactly its first CPU shared; 1-vCPU VMs can
		// still take any CPU left over from the 2-vCPU ones.
		for _, u := range Usage(topo, Policy{}, ps) {
			n, _ := topo.Node(u.Node)
			if len(u.SharedCPUs) > 2 || len(u.SharedCPUs) < 1 || u.SharedCPUs[0] != n.CPUs[0] {
				t.Errorf("%v: node %d shared CPUs %v after filling", nodes, u.Node, u.SharedCPUs)
			}
		}
	}
}

func TestPlaceRejects(t *testing.T) {
	topo := fakeTopology(t, uniform(2, 8, 32))
	for _, tc := range []struct {
		name    string
		policy  Policy
		current []Placement
		req     Request
		is      func(error) bool
		want    string
	}{
		{"no owner", Policy{}, nil, Request{VCPUs: 1, MemoryMiB: 1}, errdefs.IsInvalidArgument, "no owner"},
		{"no vcpus", Policy{}, nil, Request{Owner: "a", MemoryMiB: 1}, errdefs.IsInvalidArgument, "VM a: vcpus must be from 1 to 65536, got 0"},
		{"no memory", Policy{}, nil, Request{Owner: "a", VCPUs: 1}, errdefs.IsInvalidArgument,
			"VM a: memory must be from 1 MiB to 1073741824 MiB, got 0"},
		{"absurd memory", Policy{}, nil, Request{Owner: "a", VCPUs: 1, MemoryMiB: 1 << 40}, errdefs.IsInvalidArgument,
			"memory must be from 1 MiB"},
		{"bad mode", Policy{}, nil, Request{Owner: "a", VCPUs: 1, MemoryMiB: 1, Mode: "pinned"}, errdefs.IsInvalidArgument,
			`unknown NUMA mode "pinned"`},
		{"bad policy", Policy{CPUThreshold: -1}, nil, req("a", 1, 1), errdefs.IsInvalidArgument, "cpu_threshold = -1"},
		{"memory larger than any node", Policy{}, nil, req("big", 2, 64), errdefs.IsResourceExhausted,
			"VM big needs 64 GiB but the largest NUMA node has 32 GiB; allow_spread would spread it"},
		{"memory larger with a threshold", Policy{MemThreshold: 0.5}, nil, req("big", 2, 20), errdefs.IsResourceExhausted,
			"VM big needs 20 GiB but the largest NUMA node has 32 GiB (mem_threshold 0.5 allows 16 GiB)"},
		{"vCPUs more than any node takes", Policy{CPUThreshold: 2}, nil, req("wide", 17, 1), errdefs.IsResourceExhausted,
			"VM wide needs 17 vCPUs but the largest NUMA node takes 16 (8 usable CPUs × cpu_threshold 2)"},
		{"dedicated larger than any node", Policy{}, nil, Request{Owner: "d", VCPUs: 8, MemoryMiB: 1, Mode: ModeDedicated},
			errdefs.IsResourceExhausted,
			"dedicated VM d needs 8 CPUs but the largest NUMA node can dedicate 7 (8 usable CPUs, min_shared_cpus 1 kept shared)"},
		{"dedicated is never spread", Policy{AllowSpread: true}, nil, Request{Owner: "d", VCPUs: 12, MemoryMiB: 1, Mode: ModeDedicated},
			errdefs.IsResourceExhausted,
			"largest NUMA node can dedicate 7"},
		{"full host", Policy{}, []Placement{vm("x", 0, 2, 30), vm("y", 1, 32, 1)}, req("a", 1, 4), errdefs.IsResourceExhausted,
			"no NUMA node has room for VM a (1 vCPUs, 4 GiB, mode node): node 0: 30 GiB of 32 GiB allocated (mem_threshold 1); node 1: 32 " +
				"floating vCPUs on 8 shared CPUs (cpu_threshold 4)"},
		{"too large even spread", Policy{AllowSpread: true}, nil, req("huge", 4, 65), errdefs.IsResourceExhausted,
			"and even spread over all 2 nodes it does not fit"},
		{"no room to spread", Policy{AllowSpread: true}, []Placement{vm("x", 1, 1, 20)}, req("big", 4, 40), errdefs.IsResourceExhausted,
			"VM big (4 vCPUs, 40 GiB, mode node) is larger than any NUMA node and no 2 nodes have room for a share of 2 vCPUs and 20 GiB each: " +
				"node 0: ; node 1: 20 GiB of 32 GiB allocated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pl, err := Place(topo, tc.policy, tc.current, tc.req)
			if !tc.is(err) || !strings.Contains(fmt.Sprint(err), tc.want) {
				t.Errorf("Place = %+v, %v\nwant an error saying %q", pl, err, tc.want)
			}
		})
	}
}

func TestPlaceSpread(t *testing.T) {
	// Nodes 0-1 and 2-3 are pairs (distance 12), 21 across.
	topo := fakeTopology(t, uniform(4, 8, 32))
	p := Policy{AllowSpread: true}

	pl, err := Place(topo, p, nil, Request{Owner: "big", VCPUs: 5, MemoryMiB: 48 * 1024})
	if err != nil {
		t.Fatal(err)
	}
	want := Placement{Owner: "big", Mode: ModeNode, VCPUs: 5, MemoryMiB: 48 * 1024, Nodes: []int{0, 1},
		CPUs: []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
		GuestNodes: []GuestNode{
			{HostNode: 0, VCPUs: []int{0, 1, 2}, MemoryMiB: 24 * 1024, CPUs: []int{0, 1, 2, 3, 4, 5, 6, 7}},
			{HostNode: 1, VCPUs: []int{3, 4}, MemoryMiB: 24 * 1024, CPUs: []int{8, 9, 10, 11, 12, 13, 14, 15}},
		}}
	if !reflect.DeepEqual(pl, want) {
		t.Fatalf("spread = %+v\nwant %+v", pl, want)
	}

	// Fewest nodes: 80 GiB needs three 32 GiB nodes, not four.
	pl, err = Place(topo, p, nil, Request{Owner: "bigger", VCPUs: 6, MemoryMiB: 80 * 1024})
	if err != nil || len(pl.Nodes) != 3 || len(pl.GuestNodes) != 3 {
		t.Fatalf("80 GiB: %+v, %v; want 3 nodes", pl, err)
	}

	// The best-balanced node anchors the spread and its nearest node
	// (same pair) comes next, even if a farther one is emptier.
	current := []Placement{vm("a", 0, 8, 2), vm("b", 1, 8, 2), vm("c", 2, 1, 8), vm("d", 3, 1, 1)}
	pl, err = Place(topo, p, current, Request{Owner: "big", VCPUs: 4, MemoryMiB: 40 * 1024})
	if err != nil || !slices.Equal(pl.Nodes, []int{2, 3}) {
		t.Fatalf("spread over %v, %v; want the pair 2-3", pl.Nodes, err)
	}
	// Usage charges each cell to its host node.
	u := Usage(topo, p, append(current, pl))
	if u[2].VCPUs != 3 || u[2].MemoryMiB != 28*1024 || u[3].VCPUs != 3 || u[3].MemoryMiB != 21*1024 {
		t.Errorf("usage after spread: %+v", u)
	}

	// A VM that fits one node is never spread, even when it must wait.
	current = []Placement{vm("a", 0, 1, 20), vm("b", 1, 1, 20), vm("c", 2, 1, 20), vm("d", 3, 1, 20)}
	if pl, err := Place(topo, p, current, req("mid", 2, 16)); !errdefs.IsResourceExhausted(err) {
		t.Errorf("16 GiB on nodes with 12 GiB free each: %+v, %v; want rejected, not spread", pl, err)
	}
}

func TestPlaceModeNone(t *testing.T) {
	topo := fakeTopology(t, uniform(1, 2, 1))
	pl, err := Place(topo, Policy{}, nil, Request{Owner: "free", VCPUs: 64, MemoryMiB: 1 << 20, Mode: ModeNone})
	if err != nil || pl.Nodes != nil || pl.CPUs != nil || pl.Mode != ModeNone {
		t.Fatalf("mode none: %+v, %v", pl, err)
	}
	if u := Usage(topo, Policy{}, []Placement{pl}); u[0].VMs != 0 || u[0].VCPUs != 0 || u[0].MemoryMiB != 0 {
		t.Errorf("mode none counted: %+v", u)
	}
}

func TestParseMode(t *testing.T) {
	for in, want := range map[string]Mode{"": ModeNode, "node": ModeNode, "dedicated": ModeDedicated, "none": ModeNone} {
		if got, err := ParseMode(in); got != want || err != nil {
			t.Errorf("ParseMode(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParseMode("Node"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("ParseMode(Node): %v", err)
	}
}

func TestPlacementJSON(t *testing.T) {
	topo := fakeTopology(t, uniform(2, 4, 8))
	for _, r := range []Request{
		{Owner: "n", VCPUs: 2, MemoryMiB: 100},
		{Owner: "d", VCPUs: 2, MemoryMiB: 100, Mode: ModeDedicated},
		{Owner: "s", VCPUs: 4, MemoryMiB: 12 * 1024},
	} {
		pl, err := Place(topo, Policy{AllowSpread: true}, nil, r)
		if err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(pl)
		if err != nil {
			t.Fatal(err)
		}
		var back Placement
		if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back, pl) {
			t.Errorf("%s did not survive JSON: %s -> %+v, %v", r.Owner, b, back, err)
		}
	}
}
