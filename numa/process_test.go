package numa

import (
	"bufio"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Child processes: the test binary re-run with -test.run=^TestHelperProcess$
// and NUMA_TEST_ROLE naming what to do.
const (
	envRole  = "NUMA_TEST_ROLE"
	envRoot  = "NUMA_TEST_ROOT"  // fake sysfs tree
	envState = "NUMA_TEST_STATE" // state file
	envID    = "NUMA_TEST_ID"
	envStage = "NUMA_TEST_STAGE" // crash role: writeHook stage to die in
)

// The concurrency test's host is small and uneven so that thresholds and
// dedicated CPUs run out often.
var (
	concurrencyNodes  = []fakeNode{{"0-7", 16}, {"8-15", 16}, {"16-27", 8}}
	concurrencyPolicy = Policy{CPUThreshold: 2, MemThreshold: 1}
)

const (
	childProcs      = 4
	childGoroutines = 25
	childIterations = 16
)

func childCmd(t *testing.T, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	return cmd
}

// TestHelperProcess is not a test: it is the body of the child processes.
func TestHelperProcess(t *testing.T) {
	switch os.Getenv(envRole) {
	case "":
		t.Skip("runs only as a child of the process tests")
	case "concurrency":
		err := concurrencyChild()
		if err != nil {
			fmt.Fprintln(os.Stderr, "child", os.Getenv(envID), "failed:", err)
			os.Exit(1)
		}
	case "crash":
		crashChild()
	}
	os.Exit(0)
}

func openChildStore() (*Store, error) {
	topo, err := ReadTopology(os.Getenv(envRoot))
	if err != nil {
		return nil, err
	}
	return OpenStore(os.Getenv(envState), topo, concurrencyPolicy)
}

// concurrencyChild runs goroutines that reserve and release at random.
// After every successful Reserve it reads the state file and checks the
// invariants, that its per-node summaries match its reservations, and
// that nothing this goroutine holds has been lost.
func concurrencyChild() error {
	s, err := openChildStore()
	if err != nil {
		return err
	}
	id := os.Getenv(envID)
	var (
		mu                                    sync.Mutex
		reserved, rejected, dedicated, checks int // guarded by mu
		firstErr                              error
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if firstErr == nil {
			firstErr = err
		}
	}
	var wg sync.WaitGroup
	for g := range childGoroutines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(len(id)+int(id[0])), uint64(g)))
			var held []string
			release := func(i int) {
				if err := s.Release(held[i]); err != nil {
					fail(err)
				}
				held = slices.Delete(held, i, i+1)
			}
			for i := range childIterations {
				r := Request{
					Owner:     fmt.Sprintf("p%s-g%d-i%d", id, g, i),
					VCPUs:     1 + rng.IntN(2),
					MemoryMiB: 128 * (1 + rng.IntN(8)),
				}
				switch x := rng.IntN(20); {
				case x < 6:
					r.Mode = ModeDedicated
				case x < 7:
					r.Mode = ModeNone
				}
				pl, err := s.Reserve(r)
				if errdefs.IsResourceExhausted(err) {
					mu.Lock()
					rejected++
					mu.Unlock()
				} else if err != nil {
					fail(err)
					return
				} else {
					held = append(held, pl.Owner)
					var ps []Placement
					st, err := s.readFull()
					if err == nil {
						for _, r := range st.Reservations {
							ps = append(ps, r.Placement)
						}
						err = checkState(s.Topology(), ps)
					}
					if sums := summarize(ps); err == nil && !sameSummaries(st.Nodes, sums) {
						err = fmt.Errorf("state file summaries %+v, its reservations sum to %+v", st.Nodes, sums)
					}
					for _, o := range held {
						if err == nil && !slices.Contains(owners(ps), o) {
							err = fmt.Errorf("reservation %s was lost", o)
						}
					}
					if err != nil {
						fail(err)
						return
					}
					mu.Lock()
					reserved++
					checks++
					if r.Mode == ModeDedicated {
						dedicated++
					}
					mu.Unlock()
				}
				// Hold up to two; release at random.
				for len(held) > 2 || (len(held) > 0 && rng.IntN(2) == 0) {
					release(rng.IntN(len(held)))
				}
			}
			for len(held) > 0 {
				release(0)
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	fmt.Printf("RESULT %d %d %d %d\n", reserved, rejected, dedicated, checks)
	return nil
}

// checkState verifies the invariants of a state from the placements
// alone, with its own arithmetic: per node, floating vCPUs within
// cpu_threshold of the CPUs not dedicated and memory within mem_threshold;
// dedicated CPUs on their node, never its first (housekeeping) CPU, never
// twice; no VM placed after a dedicated one on its CPUs.
func checkState(topo *Topology, ps []Placement) error {
	p := concurrencyPolicy
	for _, n := range topo.Nodes {
		floating, ded, memMiB := 0, 0, 0
		for _, pl := range ps {
			if pl.Mode == ModeNone || pl.Nodes[0] != n.ID {
				continue
			}
			memMiB += pl.MemoryMiB
			if pl.Mode == ModeNode {
				floating += pl.VCPUs
				continue
			}
			ded += len(pl.CPUs)
			for _, c := range pl.CPUs {
				if !slices.Contains(n.CPUs, c) || c == n.CPUs[0] {
					return fmt.Errorf("%s: dedicated CPU %d is not a dedicatable CPU of node %d", pl.Owner, c, n.ID)
				}
			}
		}
		if float64(floating) > p.CPUThreshold*float64(len(n.CPUs)-ded) {
			return fmt.Errorf("node %d: %d floating vCPUs on %d shared CPUs is over cpu_threshold %g", n.ID, floating, len(n.CPUs)-ded,
				p.CPUThreshold)
		}
		if float64(memMiB)*mib > p.MemThreshold*float64(n.MemoryBytes) {
			return fmt.Errorf("node %d: %d MiB allocated of %d bytes is over mem_threshold %g", n.ID, memMiB, n.MemoryBytes, p.MemThreshold)
		}
	}
	return exclusivityViolation(ps)
}

func TestConcurrentProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	root := fakeSysfs(t, concurrencyNodes)
	state := filepath.Join(t.TempDir(), "numa.json")
	var cmds []*exec.Cmd
	var outs []*strings.Builder
	for i := range childProcs {
		cmd := childCmd(t, envRole+"=concurrency", envRoot+"="+root, envState+"="+state, fmt.Sprintf("%s=%d", envID, i))
		out := &strings.Builder{}
		cmd.Stdout = out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds, outs = append(cmds, cmd), append(outs, out)
	}
	var reserved, rejected, dedicated, checks int
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Errorf("child %d: %v\n%s", i, err, outs[i])
			continue
		}
		var r, j, d, c int
		line := outs[i].String()
		if k := strings.Index(line, "RESULT "); k < 0 {
			t.Errorf("child %d printed no result: %q", i, line)
		} else if _, err := fmt.Sscanf(line[k:], "RESULT %d %d %d %d", &r, &j, &d, &c); err != nil {
			t.Errorf("child %d: %v in %q", i, err, line)
		}
		reserved, rejected, dedicated, checks = reserved+r, rejected+j, dedicated+d, checks+c
	}
	t.Logf("%d processes × %d goroutines: %d reserved (%d dedicated), %d rejected, %d state checks",
		childProcs, childGoroutines, reserved, dedicated, rejected, checks)
	// The run must have exercised what it claims to.
	if reserved < childProcs*childGoroutines || dedicated == 0 || rejected == 0 || checks != reserved {
		t.Errorf("too little happened: %d reserved, %d dedicated, %d rejected, %d checks", reserved, dedicated, rejected, checks)
	}

	topo := fakeTopology(t, concurrencyNodes)
	s, err := OpenStore(state, topo, concurrencyPolicy)
	if err != nil {
		t.Fatal(err)
	}
	ps := snapshot(t, s)
	if len(ps) != 0 {
		t.Errorf("left over after every release: %v", owners(ps))
	}
	for _, u := range Usage(topo, concurrencyPolicy, ps) {
		if u.VCPUs != 0 || u.MemoryMiB != 0 || u.VMs != 0 || len(u.DedicatedCPUs) != 0 {
			t.Errorf("node %d not back to zero: %+v", u.Node, u)
		}
	}
}

// crashChild reserves two VMs, then stalls inside the third Reserve's
// write at the stage named by NUMA_TEST_STAGE, holding the lock, until
// the parent kills it.
func crashChild() {
	s, err := openChildStore()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, r := range []Request{
		{Owner: "child-defined", VCPUs: 2, MemoryMiB: 1024, Mode: ModeDedicated},
		{Owner: "child-leaked", VCPUs: 1, MemoryMiB: 2048, Mode: ModeDedicated},
	} {
		if _, reserveErr := s.Reserve(r); reserveErr != nil {
			fmt.Fprintln(os.Stderr, reserveErr)
			os.Exit(1)
		}
	}
	stage := os.Getenv(envStage)
	s.writeHook = func(at string) {
		if at == stage {
			fmt.Println("STALLED")
			time.Sleep(time.Hour)
		}
	}
	_, err = s.Reserve(Request{Owner: "child-torn", VCPUs: 1, MemoryMiB: 1024, Mode: ModeDedicated})
	fmt.Fprintln(os.Stderr, "the crash child was not killed:", err)
	os.Exit(1)
}

// tryLock takes and drops the store's lock without waiting.
func tryLock(path string) error {
	f, err := os.OpenFile(path+".lock", os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
}

func TestCrashMidUpdate(t *testing.T) {
	for _, stage := range []string{"tmp-partial", "before-rename"} {
		t.Run(stage, func(t *testing.T) {
			root := fakeSysfs(t, concurrencyNodes)
			state := filepath.Join(t.TempDir(), "numa.json")
			topo := fakeTopology(t, concurrencyNodes)
			s, err := OpenStore(state, topo, concurrencyPolicy)
			if err != nil {
				t.Fatal(err)
			}
			liveVM, err := s.Reserve(Request{Owner: "live", VCPUs: 2, MemoryMiB: 1024})
			if err != nil {
				t.Fatal(err)
			}

			cmd := childCmd(t, envRole+"=crash", envRoot+"="+root, envState+"="+state, envStage+"="+stage)
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err = cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			sc := bufio.NewScanner(stdout)
			for sc.Scan() && sc.Text() != "STALLED" {
			}
			if sc.Err() != nil || sc.Text() != "STALLED" {
				t.Fatalf("child did not stall: %v", sc.Err())
			}

			// The child holds the lock; the state file is the old one.
			if err = tryLock(state); !errors.Is(err, unix.EWOULDBLOCK) {
				t.Fatalf("lock while the child stalls in its write: %v, want EWOULDBLOCK", err)
			}
			before := snapshot(t, s)
			if got := owners(before); !slices.Equal(got, []string{"live", "child-defined", "child-leaked"}) {
				t.Fatalf("state while the child stalls: %v", got)
			}

			if err = cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			if err = cmd.Wait(); err == nil {
				t.Fatal("child exited cleanly")
			}

			// The kernel released the lock; the state is still the old one
			// (never torn), and the next writer overwrites the leftover
			// temporary file.
			if err = tryLock(state); err != nil {
				t.Fatalf("lock after the child died: %v", err)
			}
			if after := snapshot(t, s); !slices.Equal(owners(after), owners(before)) {
				t.Fatalf("state after the kill: %v, want %v", owners(after), owners(before))
			}
			_, err = s.Reserve(Request{Owner: "inflight", VCPUs: 1, MemoryMiB: 512, Mode: ModeDedicated})
			if err != nil {
				t.Fatal(err)
			}

			// A shim starts: libvirt has "live" and "child-defined";
			// "child-leaked" was reserved by the dead child and never
			// defined; "inflight" is this process's, still being created.
			var defined Placement
			for _, pl := range before {
				if pl.Owner == "child-defined" {
					defined = pl
				}
			}
			dropped, err := s.Reconcile([]Placement{liveVM, defined})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(dropped, []string{"child-leaked"}) {
				t.Errorf("dropped %v, want [child-leaked]", dropped)
			}
			got := snapshot(t, s)
			if !slices.Equal(owners(got), []string{"live", "child-defined", "inflight"}) {
				t.Fatalf("after Reconcile: %v", owners(got))
			}
			// Counts are those of exactly these three VMs.
			want := map[int][2]int{} // node → floating vCPUs, MiB
			dedCPUs := 0
			for _, pl := range got {
				w := want[pl.Nodes[0]]
				if pl.Mode == ModeNode {
					w[0] += pl.VCPUs
				} else {
					dedCPUs += len(pl.CPUs)
				}
				w[1] += pl.MemoryMiB
				want[pl.Nodes[0]] = w
			}
			gotDed := 0
			for _, u := range Usage(topo, concurrencyPolicy, got) {
				if w := want[u.Node]; u.VCPUs != w[0] || u.MemoryMiB != int64(w[1]) {
					t.Errorf("node %d: %d vCPUs, %d MiB; want %v", u.Node, u.VCPUs, u.MemoryMiB, w)
				}
				gotDed += len(u.DedicatedCPUs)
			}
			if gotDed != 2+1 || dedCPUs != 3 {
				t.Errorf("%d dedicated CPUs held, want 3 (child-defined's 2, inflight's 1)", gotDed)
			}
			if err := checkState(topo, got); err != nil {
				t.Error(err)
			}
		})
	}
}
