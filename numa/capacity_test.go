package numa

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/containerd/errdefs"
)

// fill places VMs of the sizes next() returns, one after another, until
// Place refuses one; it returns the vCPUs placed and the refusal.
func fill(t *testing.T, topo *Topology, p Policy, next func(i int) int) (placed int, refused Request, err error) {
	t.Helper()
	var current []Placement
	for i := 0; ; i++ {
		r := Request{Owner: fmt.Sprintf("vm%d", i), VCPUs: next(i), MemoryMiB: 64}
		pl, err := Place(topo, p, current, r)
		if err != nil {
			return placed, r, err
		}
		current = append(current, pl)
		placed += r.VCPUs
		if i > 100000 {
			t.Fatal("Place never refused")
		}
	}
}

// TestVCPUCapacityAgreesWithPlace holds the figure the node installer
// advertises to what the shim's admission does: Place takes exactly
// VCPUCapacity 1-vCPU VMs, then refuses the next for capacity.
func TestVCPUCapacityAgreesWithPlace(t *testing.T) {
	for _, tc := range []struct {
		name   string
		nodes  []fakeNode
		policy Policy
		want   int
	}{
		{"the 2-CPU node of the issue", uniform(1, 2, 24), Policy{}, 8},
		{"no overcommit", uniform(1, 2, 24), Policy{CPUThreshold: 1}, 2},
		{"fractional threshold rounds down", uniform(1, 3, 24), Policy{CPUThreshold: 1.5}, 4},
		{"threshold below 1", uniform(1, 4, 24), Policy{CPUThreshold: 0.5}, 2},
		{"reserved CPUs give nothing", uniform(1, 4, 24), Policy{ReservedCPUs: []int{0, 1}}, 8},
		{"two nodes add up", uniform(2, 4, 16), Policy{CPUThreshold: 2.5}, 20},
		{"a memory-only node adds nothing", []fakeNode{{"0-3", 16}, {"", 16}}, Policy{}, 16},
		{"a node whose CPUs are all reserved adds nothing", uniform(2, 2, 16), Policy{ReservedCPUs: []int{2, 3}}, 8},
		{"uneven nodes", []fakeNode{{"0-1", 16}, {"2-7", 16}}, Policy{CPUThreshold: 3}, 24},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topo := fakeTopology(t, tc.nodes)
			got, err := VCPUCapacity(topo, tc.policy)
			if err != nil || got != tc.want {
				t.Fatalf("VCPUCapacity = %d, %v; want %d", got, err, tc.want)
			}
			placed, _, err := fill(t, topo, tc.policy, func(int) int { return 1 })
			if placed != got || !errors.Is(err, errdefs.ErrResourceExhausted) {
				t.Fatalf("Place took %d 1-vCPU VMs then said %v; VCPUCapacity is %d", placed, err, got)
			}
		})
	}
}

// TestVCPUCapacityOneNodeAnySizes: on a host of one NUMA node every
// sequence of node-mode VMs whose vCPUs add up to at most VCPUCapacity is
// admitted, and the VM that would pass it is refused for capacity: a pod
// that requested its vCPUs' slots and was admitted by kubelet is never
// refused by the shim.
func TestVCPUCapacityOneNodeAnySizes(t *testing.T) {
	rng := rand.New(rand.NewPCG(27, 1))
	for _, p := range []Policy{{}, {CPUThreshold: 1}, {CPUThreshold: 1.5}, {CPUThreshold: 3, ReservedCPUs: []int{0}}} {
		topo := fakeTopology(t, uniform(1, 4, 64))
		capacity, err := VCPUCapacity(topo, p)
		if err != nil {
			t.Fatal(err)
		}
		for range 50 {
			placed, refused, err := fill(t, topo, p, func(int) int { return 1 + rng.IntN(4) })
			if !errors.Is(err, errdefs.ErrResourceExhausted) || placed > capacity || placed+refused.VCPUs <= capacity {
				t.Fatalf("policy %+v: placed %d vCPUs, then a VM of %d refused (%v); VCPUCapacity %d", p, placed, refused.VCPUs, err, capacity)
			}
		}
	}
}

// TestVCPUSlotsDedicated: a dedicated VM's slots cover the floating
// capacity its CPUs take away from the node.
func TestVCPUSlotsDedicated(t *testing.T) {
	for _, p := range []Policy{{}, {CPUThreshold: 1}, {CPUThreshold: 2.5}, {CPUThreshold: 0.5}} {
		topo := fakeTopology(t, uniform(1, 8, 64))
		capacity, err := VCPUCapacity(topo, p)
		if err != nil {
			t.Fatal(err)
		}
		ded, err := Place(topo, p, nil, Request{Owner: "d", VCPUs: 3, MemoryMiB: 64, Mode: ModeDedicated})
		if err != nil {
			t.Fatal(err)
		}
		slots, err := VCPUSlots(p, ModeDedicated, 3)
		if err != nil {
			t.Fatal(err)
		}
		var current = []Placement{ded}
		floating := 0
		for i := 0; ; i++ {
			pl, err := Place(topo, p, current, Request{Owner: fmt.Sprint(i), VCPUs: 1, MemoryMiB: 64})
			if err != nil {
				break
			}
			current = append(current, pl)
			floating++
		}
		if floating < capacity-slots {
			t.Errorf("policy %+v: after a 3-CPU dedicated VM (%d slots of %d) Place took %d 1-vCPU VMs, want at least %d",
				p, slots, capacity, floating, capacity-slots)
		}
	}
}

func TestVCPUSlots(t *testing.T) {
	for _, tc := range []struct {
		p     Policy
		mode  Mode
		vcpus int
		want  int
	}{
		{Policy{}, ModeNode, 3, 3},
		{Policy{}, "", 1, 1},
		{Policy{}, ModeDedicated, 2, 8},
		{Policy{CPUThreshold: 1.5}, ModeDedicated, 2, 4},
		{Policy{}, ModeNone, 2, 0},
	} {
		if got, err := VCPUSlots(tc.p, tc.mode, tc.vcpus); err != nil || got != tc.want {
			t.Errorf("VCPUSlots(%+v, %q, %d) = %d, %v; want %d", tc.p, tc.mode, tc.vcpus, got, err, tc.want)
		}
	}
	for _, bad := range []struct {
		p     Policy
		mode  Mode
		vcpus int
	}{{Policy{}, ModeNode, 0}, {Policy{}, "spread", 1}, {Policy{CPUThreshold: -1}, ModeNode, 1}} {
		if _, err := VCPUSlots(bad.p, bad.mode, bad.vcpus); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("VCPUSlots(%+v, %q, %d): %v, want InvalidArgument", bad.p, bad.mode, bad.vcpus, err)
		}
	}
	if _, err := VCPUCapacity(&Topology{}, Policy{}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("VCPUCapacity of no nodes: %v, want InvalidArgument", err)
	}
}
