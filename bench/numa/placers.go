package main

import (
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/containerd/errdefs"

	"github.com/kvm-shim/containerd-shim-kvm-v1/numa"
)

// ours places through a numa.Store on a real state file: every decision
// takes the file lock, reads the state, runs numa.Place and writes the
// state back. It also times numa.Place alone on the same state, and
// checks that both decide the same.
type ours struct {
	store                   *numa.Store
	t                       *numa.Topology
	current                 []numa.Placement // mirror of the store, for ratios
	place, reserve, release []time.Duration
}

func (o *ours) name() string { return "ours (numa.Store)" }

func owner(vm int) string { return fmt.Sprint("vm-", vm) }

func (o *ours) add(vm int, s vmSize) (bool, bool, error) {
	r := numa.Request{Owner: owner(vm), VCPUs: s.vcpus, MemoryMiB: s.memGiB << 10}
	start := time.Now()
	want, perr := numa.Place(o.t, o.store.Policy(), o.current, r)
	o.place = append(o.place, time.Since(start))

	start = time.Now()
	pl, err := o.store.Reserve(r)
	o.reserve = append(o.reserve, time.Since(start))
	if errdefs.IsResourceExhausted(err) {
		if perr == nil {
			return false, false, fmt.Errorf("the store rejected %s, which Place admitted", r.Owner)
		}
		return false, false, nil
	}
	if err != nil {
		return false, false, err
	}
	if !reflect.DeepEqual(pl, want) {
		return false, false, fmt.Errorf("the store placed %s as %+v, Place on the same state as %+v", r.Owner, pl, want)
	}
	o.current = append(o.current, pl)
	return true, pl.Spread(), nil
}

func (o *ours) remove(vm int) error {
	start := time.Now()
	err := o.store.Release(owner(vm))
	o.release = append(o.release, time.Since(start))
	o.current = slices.DeleteFunc(o.current, func(p numa.Placement) bool { return p.Owner == owner(vm) })
	return err
}

func (o *ours) ratios() (cpu, mem []float64) {
	for _, u := range numa.Usage(o.t, o.store.Policy(), o.current) {
		cpu = append(cpu, u.CPURatio)
		mem = append(mem, u.MemRatio)
	}
	return cpu, mem
}

// nodeCounts is the simple per-node arithmetic of the other placers.
type nodeCounts struct {
	cpus, memGiB []int // capacity
	usedCPU      []int // vCPUs (first-fit) or exclusive CPUs (cpu-manager)
	usedMem      []int
	held         map[int][][3]int // vm -> (node, cpus, GiB) parts
}

func newCounts(t *numa.Topology) nodeCounts {
	c := nodeCounts{held: map[int][][3]int{}}
	for _, n := range t.Nodes {
		c.cpus = append(c.cpus, len(n.CPUs))
		c.memGiB = append(c.memGiB, int(n.MemoryBytes>>30))
	}
	c.usedCPU = make([]int, len(c.cpus))
	c.usedMem = make([]int, len(c.cpus))
	return c
}

func (c *nodeCounts) take(vm, node, cpus, mem int) {
	c.usedCPU[node] += cpus
	c.usedMem[node] += mem
	c.held[vm] = append(c.held[vm], [3]int{node, cpus, mem})
}

func (c *nodeCounts) remove(vm int) error {
	for _, p := range c.held[vm] {
		c.usedCPU[p[0]] -= p[1]
		c.usedMem[p[0]] -= p[2]
	}
	delete(c.held, vm)
	return nil
}

func (c *nodeCounts) ratios() (cpu, mem []float64) {
	for i := range c.cpus {
		cpu = append(cpu, float64(c.usedCPU[i])/float64(c.cpus[i]))
		mem = append(mem, float64(c.usedMem[i])/float64(c.memGiB[i]))
	}
	return cpu, mem
}

// firstFit takes the lowest-numbered node within the same thresholds as
// ours (CPU overcommit 4, memory 1), never splitting.
type firstFit struct{ nodeCounts }

func newFirstFit(t *numa.Topology) *firstFit { return &firstFit{newCounts(t)} }

func (f *firstFit) name() string { return "first-fit" }

func (f *firstFit) add(vm int, s vmSize) (bool, bool, error) {
	for i := range f.cpus {
		if float64(f.usedCPU[i]+s.vcpus) <= numa.DefaultCPUThreshold*float64(f.cpus[i]) &&
			float64(f.usedMem[i]+s.memGiB) <= numa.DefaultMemThreshold*float64(f.memGiB[i]) {
			f.take(vm, i, s.vcpus, s.memGiB)
			return true, false, nil
		}
	}
	return false, false, nil
}

// cpuManager imitates the kubelet's static CPU manager with the memory
// manager: whole exclusive CPUs, no overcommit. It prefers the single node
// that fits most tightly (packing, as the kubelet does); when no node
// fits alone it takes CPUs and memory from several nodes, fullest first,
// so the VM is split, possibly unevenly.
type cpuManager struct{ nodeCounts }

func newCPUManager(t *numa.Topology) *cpuManager { return &cpuManager{newCounts(t)} }

func (c *cpuManager) name() string { return "cpu-manager-like" }

func (c *cpuManager) add(vm int, s vmSize) (bool, bool, error) {
	best := -1
	for i := range c.cpus {
		freeCPU, freeMem := c.cpus[i]-c.usedCPU[i], c.memGiB[i]-c.usedMem[i]
		if freeCPU >= s.vcpus && freeMem >= s.memGiB && (best < 0 || freeCPU < c.cpus[best]-c.usedCPU[best]) {
			best = i
		}
	}
	if best >= 0 {
		c.take(vm, best, s.vcpus, s.memGiB)
		return true, false, nil
	}
	totalCPU, totalMem := 0, 0
	for i := range c.cpus {
		totalCPU += c.cpus[i] - c.usedCPU[i]
		totalMem += c.memGiB[i] - c.usedMem[i]
	}
	if totalCPU < s.vcpus || totalMem < s.memGiB {
		return false, false, nil
	}
	order := make([]int, len(c.cpus))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { // fullest (fewest free CPUs) first
		return (c.cpus[a] - c.usedCPU[a]) - (c.cpus[b] - c.usedCPU[b])
	})
	needCPU, needMem := s.vcpus, s.memGiB
	nodes := map[int]bool{}
	for _, i := range order {
		cpu := min(needCPU, c.cpus[i]-c.usedCPU[i])
		mem := min(needMem, c.memGiB[i]-c.usedMem[i])
		if cpu == 0 && mem == 0 {
			continue
		}
		c.take(vm, i, cpu, mem)
		needCPU, needMem = needCPU-cpu, needMem-mem
		nodes[i] = true
		if needCPU == 0 && needMem == 0 {
			break
		}
	}
	return true, len(nodes) > 1, nil
}
