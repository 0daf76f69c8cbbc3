// Command numa-bench simulates VM arrivals and departures on NUMA hosts
// and compares the numa package's placement (through a real Store, file
// lock and all) with first-fit and a Kubernetes-CPU-manager-like packer,
// side by side on the same seeded workload. It prints two tables: the
// outcome of each placer per host, and the latency of the store's calls.
//
//	go run ./bench/numa [-arrivals 10000] [-seed 1] [-lifetime 45] [-dir /dev/shm]
package main

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/kvm-shim/containerd-shim-kvm-v1/numa"
)

func main() {
	arrivals := flag.Int("arrivals", 10000, "VM arrivals per host")
	seed := flag.Uint64("seed", 1, "workload seed")
	lifetime := flag.Float64("lifetime", 45, "mean VM lifetime, in mean inter-arrival times (sets the offered load)")
	dir := flag.String("dir", defaultDir(), "directory for the store's state file (tmpfs like /run by default)")
	diskDir := flag.String("disk-dir", os.TempDir(), "directory on a disk file system for the fsync latency row (\"\" to skip)")
	flag.Parse()
	if err := run(*arrivals, *seed, *lifetime, *dir, *diskDir); err != nil {
		fmt.Fprintln(os.Stderr, "numa-bench:", err)
		os.Exit(1)
	}
}

func defaultDir() string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		return "/dev/shm"
	}
	return os.TempDir()
}

// host is a simulated machine: name and nodes of (CPUs, GiB).
type host struct {
	name  string
	nodes [][2]int
}

var hosts = []host{
	{"2 x (32 CPUs, 256 GiB)", [][2]int{{32, 256}, {32, 256}}},
	{"4 x (16 CPUs, 128 GiB)", [][2]int{{16, 128}, {16, 128}, {16, 128}, {16, 128}}},
	{"8 x (8 CPUs, 64 GiB)", [][2]int{{8, 64}, {8, 64}, {8, 64}, {8, 64}, {8, 64}, {8, 64}, {8, 64}, {8, 64}}},
	{"uneven 24/192 8/64 16/128 16/96", [][2]int{{24, 192}, {8, 64}, {16, 128}, {16, 96}}},
}

// topology builds the numa.Topology of a host: CPUs numbered node by
// node, distance 10 local and 21 remote.
func (h host) topology() *numa.Topology {
	t := &numa.Topology{}
	cpu := 0
	for i, n := range h.nodes {
		node := numa.Node{ID: i, MemoryBytes: uint64(n[1]) << 30}
		for range n[0] {
			node.CPUs = append(node.CPUs, cpu)
			cpu++
		}
		for j := range h.nodes {
			node.Distances = append(node.Distances, map[bool]int{true: 10, false: 21}[i == j])
		}
		t.Nodes = append(t.Nodes, node)
	}
	return t
}

// event is an arrival (vm >= 0 arriving) or a departure of vm.
type event struct {
	at     float64
	vm     int
	arrive bool
}

type vmSize struct{ vcpus, memGiB int }

// workload draws the arrivals: Poisson arrivals (mean gap 1), exponential
// lifetimes, sizes weighted toward small VMs: vCPUs 1 (25%), 2 (30%),
// 4 (25%), 8 (13%), 16 (7%); GiB per vCPU 1 (15%), 2 (35%), 4 (35%),
// 8 (15%), memory clamped to 1-64 GiB.
func workload(n int, seed uint64, lifetime float64) ([]vmSize, []event) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	pick := func(values []int, weights []int) int {
		x := rng.IntN(100)
		for i, w := range weights {
			if x < w {
				return values[i]
			}
			x -= w
		}
		return values[len(values)-1]
	}
	sizes := make([]vmSize, n)
	events := make([]event, 0, 2*n)
	now := 0.0
	for i := range n {
		now += rng.ExpFloat64()
		v := pick([]int{1, 2, 4, 8, 16}, []int{25, 30, 25, 13, 7})
		m := min(max(v*pick([]int{1, 2, 4, 8}, []int{15, 35, 35, 15}), 1), 64)
		sizes[i] = vmSize{v, m}
		events = append(events, event{now, i, true}, event{now + rng.ExpFloat64()*lifetime, i, false})
	}
	slices.SortStableFunc(events, func(a, b event) int {
		if a.at != b.at {
			return map[bool]int{true: -1, false: 1}[a.at < b.at]
		}
		return 0
	})
	return sizes, events
}

// placer is one placement strategy under simulation.
type placer interface {
	name() string
	// add places the VM; ok is false when it is rejected. split: it
	// spans more than one node.
	add(vm int, s vmSize) (ok, split bool, err error)
	remove(vm int) error
	// ratios returns each node's CPU and memory allocation ratios.
	ratios() (cpu, mem []float64)
}

// result is what one placer did on one host.
type result struct {
	placer                         string
	beforeFirstReject              int
	admitted, rejected, split      int
	worstImbalance, meanImbalance  float64 // max over nodes of |cpu-mem|, worst and averaged over events
	worstMemSpread, worstCPUSpread float64 // max-min over nodes
}

func simulate(p placer, sizes []vmSize, events []event) (result, error) {
	r := result{placer: p.name(), beforeFirstReject: -1}
	placed := make([]bool, len(sizes))
	var sumImbalance float64
	for _, e := range events {
		if e.arrive {
			ok, split, err := p.add(e.vm, sizes[e.vm])
			if err != nil {
				return r, err
			}
			if !ok {
				r.rejected++
				if r.beforeFirstReject < 0 {
					r.beforeFirstReject = r.admitted
				}
				continue
			}
			placed[e.vm] = true
			r.admitted++
			if split {
				r.split++
			}
		} else if placed[e.vm] {
			if err := p.remove(e.vm); err != nil {
				return r, err
			}
			placed[e.vm] = false
		}
		cpu, mem := p.ratios()
		worst := 0.0
		for i := range cpu {
			worst = max(worst, math.Abs(cpu[i]-mem[i]))
		}
		sumImbalance += worst
		r.worstImbalance = max(r.worstImbalance, worst)
		r.worstMemSpread = max(r.worstMemSpread, slices.Max(mem)-slices.Min(mem))
		r.worstCPUSpread = max(r.worstCPUSpread, slices.Max(cpu)-slices.Min(cpu))
	}
	if r.beforeFirstReject < 0 {
		r.beforeFirstReject = r.admitted
	}
	r.meanImbalance = sumImbalance / float64(len(events))
	return r, nil
}

func run(arrivals int, seed uint64, lifetime float64, dir, diskDir string) error {
	sizes, events := workload(arrivals, seed, lifetime)
	var vcpus, mem float64
	for _, s := range sizes {
		vcpus += float64(s.vcpus)
		mem += float64(s.memGiB)
	}
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("workload: %d arrivals, seed %d, mean %.2f vCPUs and %.1f GiB per VM, mean lifetime %g arrivals (offered: %.0f vCPUs, %.0f "+
		"GiB at once)\n",
		arrivals, seed, vcpus/float64(arrivals), mem/float64(arrivals), lifetime,
		vcpus/float64(arrivals)*lifetime, mem/float64(arrivals)*lifetime)
	fmt.Printf("ours and first-fit: cpu_threshold %g, mem_threshold %g, no spread; cpu-manager: exclusive CPUs, no overcommit, splits "+
		"allowed\n",
		numa.DefaultCPUThreshold, numa.DefaultMemThreshold)
	fmt.Printf("store state file in %s; load average %s\n", dir, strings.TrimSpace(string(load)))

	out := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(out,
		"host\tplacer\tadmitted before 1st reject\tadmitted\trejected\tsplit VMs\tworst |cpu-mem|\tmean |cpu-mem|\tworst mem spread\tworst cpu "+
			"spread\t")
	var lat []latencyRow
	for _, h := range hosts {
		t := h.topology()
		work, err := os.MkdirTemp(dir, "numa-bench-")
		if err != nil {
			return err
		}
		store, err := numa.OpenStore(filepath.Join(work, "numa.json"), t, numa.Policy{})
		if err != nil {
			return err
		}
		placers := []placer{&ours{store: store, t: t}, newFirstFit(t), newCPUManager(t)}
		for _, p := range placers {
			r, err := simulate(p, sizes, events)
			if err != nil {
				os.RemoveAll(work)
				return fmt.Errorf("%s on %s: %w", p.name(), h.name, err)
			}
			fmt.Fprintf(out, "%s\t%s\t%d\t%d\t%d\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t\n", h.name, r.placer, r.beforeFirstReject,
				r.admitted, r.rejected, r.split, r.worstImbalance, r.meanImbalance, r.worstMemSpread, r.worstCPUSpread)
			if o, ok := p.(*ours); ok {
				lat = append(lat, latencyRow{h.name, o})
			}
		}
		os.RemoveAll(work)
	}
	out.Flush()

	fmt.Println()
	lt := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(lt, "host\tcall\tcalls\tp50\tp99\tmax\t")
	for _, l := range lat {
		for _, c := range []struct {
			name string
			d    []time.Duration
		}{{"Place (pure)", l.o.place}, {"Reserve (lock+read+Place+write)", l.o.reserve}, {"Release", l.o.release}} {
			writeLatency(lt, l.host, c.name, c.d)
		}
	}
	user, sys, err := cpuPerCall(hosts[2].topology(), dir, 5000)
	if err != nil {
		return err
	}
	if err := lt.Flush(); err != nil {
		return err
	}
	fmt.Printf("CPU time of Reserve and Release on %s, 8 nodes, mean per call: %s user, %s system\n", hosts[2].name, round(user), round(sys))
	if diskDir != "" {
		d, err := diskReserves(hosts[2].topology(), diskDir, 500)
		if err != nil {
			return err
		}
		slices.Sort(d)
		fmt.Printf("Reserve with the state file on %s (fsync to disk), 8 nodes, %d calls: p50 %s, p99 %s, max %s\n",
			diskDir, len(d), round(d[len(d)/2]), round(d[len(d)*99/100]), round(d[len(d)-1]))
	}
	return nil
}

type latencyRow struct {
	host string
	o    *ours
}

func writeLatency(w *tabwriter.Writer, host, call string, d []time.Duration) {
	if len(d) == 0 {
		return
	}
	s := slices.Clone(d)
	slices.Sort(s)
	q := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\t\n", host, call, len(s), round(q(0.50)), round(q(0.99)), round(s[len(s)-1]))
}

func round(d time.Duration) string {
	if d < time.Millisecond {
		return fmt.Sprintf("%.1fµs", float64(d)/float64(time.Microsecond))
	}
	return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
}

// cpuPerCall is the process's CPU time per Reserve or Release, over n of
// each in dir with the store half full: what the calls cost apart from
// waiting for a CPU on a busy machine.
func cpuPerCall(t *numa.Topology, dir string, n int) (user, sys time.Duration, err error) {
	work, err := os.MkdirTemp(dir, "numa-bench-")
	if err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(work)
	s, err := numa.OpenStore(filepath.Join(work, "numa.json"), t, numa.Policy{})
	if err != nil {
		return 0, 0, err
	}
	for i := range 30 {
		if _, err := s.Reserve(numa.Request{Owner: fmt.Sprint("base", i), VCPUs: 2, MemoryMiB: 8 << 10}); err != nil {
			return 0, 0, err
		}
	}
	var before, after syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &before); err != nil {
		return 0, 0, err
	}
	for i := range n {
		owner := fmt.Sprint("vm", i)
		if _, err := s.Reserve(numa.Request{Owner: owner, VCPUs: 2, MemoryMiB: 4 << 10}); err != nil {
			return 0, 0, err
		}
		if err := s.Release(owner); err != nil {
			return 0, 0, err
		}
	}
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &after); err != nil {
		return 0, 0, err
	}
	calls := time.Duration(2 * n)
	return time.Duration(after.Utime.Nano()-before.Utime.Nano()) / calls, time.Duration(after.Stime.Nano()-before.Stime.Nano()) / calls, nil
}

// diskReserves times Reserve on a state file in dir, with the store half
// full, n times.
func diskReserves(t *numa.Topology, dir string, n int) ([]time.Duration, error) {
	work, err := os.MkdirTemp(dir, "numa-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	s, err := numa.OpenStore(filepath.Join(work, "numa.json"), t, numa.Policy{})
	if err != nil {
		return nil, err
	}
	for i := range 30 {
		if _, err := s.Reserve(numa.Request{Owner: fmt.Sprint("base", i), VCPUs: 2, MemoryMiB: 8 << 10}); err != nil {
			return nil, err
		}
	}
	var out []time.Duration
	for i := range n {
		owner := fmt.Sprint("vm", i)
		start := time.Now()
		if _, err := s.Reserve(numa.Request{Owner: owner, VCPUs: 2, MemoryMiB: 4 << 10}); err != nil {
			return nil, err
		}
		out = append(out, time.Since(start))
		if err := s.Release(owner); err != nil {
			return nil, err
		}
	}
	return out, nil
}
