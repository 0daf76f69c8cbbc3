package numa

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// sameLedger compares what two ledgers hold, node by node.
func sameLedger(a, b *ledger) error {
	for i := range a.nodes {
		x, y := a.nodes[i], b.nodes[i]
		if x.vcpus != y.vcpus || x.ded != y.ded || x.memMiB != y.memMiB || x.vms != y.vms {
			return fmt.Errorf("node %d: %+v vs %+v", x.node.ID, x, y)
		}
	}
	if !slices.Equal(a.dedicated, b.dedicated) {
		return fmt.Errorf("dedicated CPUs differ")
	}
	return nil
}

// sameSummaries: equal, with no summaries written as null or [].
func sameSummaries(a, b []nodeSummary) bool {
	return (len(a) == 0 && len(b) == 0) || reflect.DeepEqual(a, b)
}

// The per-node summaries the Store decides on hold exactly what the
// placements hold, through any sequence of additions and removals, on
// every kind of placement, reserved CPUs included.
func TestSummaryMatchesPlacements(t *testing.T) {
	for _, nodes := range [][]fakeNode{uniform(1, 4, 8), uniform(2, 6, 16), uniform(4, 4, 8), uniform(8, 3, 4),
		{{"0-5", 8}, {"6-7", 32}, {"8-15", 4}}} {
		topo := fakeTopology(t, nodes)
		p := Policy{AllowSpread: true, ReservedCPUs: []int{1}}.WithDefaults()
		rng := rand.New(rand.NewPCG(uint64(len(nodes)), 7))
		var ps []Placement
		var sums []nodeSummary
		for i := range 400 {
			if len(ps) > 0 && rng.IntN(3) == 0 {
				j := rng.IntN(len(ps))
				sums = addToSummary(sums, &ps[j], -1)
				ps = slices.Delete(ps, j, j+1)
			} else {
				r := Request{Owner: fmt.Sprint("vm", i), VCPUs: 1 + rng.IntN(6), MemoryMiB: 512 * (1 + rng.IntN(40)),
					Mode: []Mode{ModeNode, ModeNode, ModeDedicated, ModeNone}[rng.IntN(4)]}
				pl, err := newLedgerFromSummary(topo, p, sums).decide(r)
				want, werr := Place(topo, p, ps, r)
				if !reflect.DeepEqual(pl, want) || (err == nil) != (werr == nil) {
					t.Fatalf("deciding on summaries gave %+v, %v; on placements %+v, %v", pl, err, want, werr)
				}
				if err != nil {
					continue
				}
				ps = append(ps, pl)
				sums = addToSummary(sums, &pl, 1)
			}
			if err := sameLedger(newLedgerFromSummary(topo, p, sums), newLedger(topo, p, ps)); err != nil {
				t.Fatalf("%v after %d steps: %v", nodes, i, err)
			}
			if !sameSummaries(sums, summarize(ps)) {
				t.Fatalf("incremental summaries %+v, from scratch %+v", sums, summarize(ps))
			}
		}
		for len(ps) > 0 {
			sums = addToSummary(sums, &ps[0], -1)
			ps = ps[1:]
		}
		if len(sums) != 0 {
			t.Errorf("summaries left after removing everything: %+v", sums)
		}
	}
}

// The state file is one JSON document, one reservation per line, its
// summaries equal to those of its reservations.
func TestStateFileLayout(t *testing.T) {
	s := newTestStore(t, uniform(2, 4, 8), Policy{})
	for i, m := range []Mode{ModeNode, ModeDedicated, ModeNone, ModeNode} {
		if _, err := s.Reserve(Request{Owner: fmt.Sprintf("vm<%d>", i), VCPUs: 2, MemoryMiB: 1024, Mode: m}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Release("vm<0>"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(s.file.Path())
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) != 5 || !strings.HasSuffix(lines[0], `"reservations":[`) || lines[4] != "]}" ||
		!strings.HasPrefix(lines[1], `{"owner":"vm\u003c1\u003e",`) || !strings.HasSuffix(lines[2], "},") || strings.HasSuffix(lines[3], ",") {
		t.Errorf("state file layout:\n%s", b)
	}
	var st stateFile
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	var ps []Placement
	for _, r := range st.Reservations {
		ps = append(ps, r.Placement)
	}
	if !sameSummaries(st.Nodes, summarize(ps)) {
		t.Errorf("summaries %+v, want %+v", st.Nodes, summarize(ps))
	}
	if got, _ := s.Reserve(Request{Owner: "vm<1>", VCPUs: 2, MemoryMiB: 1024, Mode: ModeDedicated}); !reflect.DeepEqual(got, ps[0]) {
		t.Errorf("owner with escaped characters not found again: %+v", got)
	}
}

// A state file someone rewrote (here: compact, summaries wrong) is read
// whole and its summaries recomputed before the next decision.
func TestStateFileEditedByHand(t *testing.T) {
	s := newTestStore(t, uniform(1, 4, 8), Policy{})
	pl := Placement{Owner: "d", Mode: ModeDedicated, VCPUs: 3, MemoryMiB: 1024, Nodes: []int{0}, CPUs: CPUList{1, 2, 3},
		VCPUPins: []int{1, 2, 3}, EmulatorCPUs: CPUList{0}}
	st := stateFile{Version: 1, Generation: 9, Nodes: []nodeSummary{{Node: 0}}, Reservations: []reservation{{Placement: pl}}}
	b, _ := json.MarshalIndent(st, "", " ")
	if err := os.WriteFile(s.file.Path(), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reserve(Request{Owner: "d2", VCPUs: 1, MemoryMiB: 1, Mode: ModeDedicated}); err == nil {
		t.Error("CPUs 1-3 were given again: the summaries were trusted")
	}
	if _, err := s.Reserve(Request{Owner: "n", VCPUs: 1, MemoryMiB: 1}); err != nil {
		t.Fatal(err)
	}
	full, err := s.readFull()
	if err != nil || full.Generation != 10 || len(full.Reservations) != 2 || !slices.Equal(full.Nodes[0].Dedicated, CPUList{1, 2, 3}) {
		t.Errorf("after the edit: %+v, %v", full, err)
	}
}
