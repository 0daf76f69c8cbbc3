package numa

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/procfs"
)

func newTestStore(t *testing.T, nodes []fakeNode, p Policy) *Store {
	t.Helper()
	s, err := OpenStore(filepath.Join(t.TempDir(), "numa.json"), fakeTopology(t, nodes), p)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func owners(ps []Placement) []string {
	var out []string
	for _, pl := range ps {
		out = append(out, pl.Owner)
	}
	return out
}

func snapshot(t *testing.T, s *Store) []Placement {
	t.Helper()
	ps, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

func TestStoreReserveRelease(t *testing.T) {
	s := newTestStore(t, uniform(2, 4, 8), Policy{})
	if ps := snapshot(t, s); len(ps) != 0 {
		t.Fatalf("new store holds %v", ps)
	}
	a, err := s.Reserve(Request{Owner: "a", VCPUs: 2, MemoryMiB: 2048})
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Reserve(Request{Owner: "b", VCPUs: 2, MemoryMiB: 2048, Mode: ModeDedicated})
	if err != nil {
		t.Fatal(err)
	}
	// The store decides exactly as Place would on its state.
	want, _ := Place(s.Topology(), s.Policy(), []Placement{a}, Request{Owner: "b", VCPUs: 2, MemoryMiB: 2048, Mode: ModeDedicated})
	if !reflect.DeepEqual(b, want) {
		t.Errorf("Reserve b = %+v, Place says %+v", b, want)
	}
	if got := owners(snapshot(t, s)); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("snapshot owners %v", got)
	}

	// Idempotent per owner; a different size for the same owner is refused.
	again, err := s.Reserve(Request{Owner: "b", VCPUs: 2, MemoryMiB: 2048, Mode: ModeDedicated})
	if err != nil || !reflect.DeepEqual(again, b) {
		t.Errorf("second Reserve of b = %+v, %v; want the same placement", again, err)
	}
	if _, err := s.Reserve(Request{Owner: "b", VCPUs: 4, MemoryMiB: 2048, Mode: ModeDedicated}); !errdefs.IsAlreadyExists(err) ||
		!strings.Contains(err.Error(), "VM b already holds a NUMA placement for 2 vCPUs, 2 GiB, mode dedicated") {
		t.Errorf("resized Reserve of b: %v", err)
	}
	if len(snapshot(t, s)) != 2 {
		t.Error("a repeated Reserve added a reservation")
	}

	if err := s.Release("a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Release("never-reserved"); err != nil {
		t.Errorf("Release of an unknown owner: %v", err)
	}
	if got := owners(snapshot(t, s)); !slices.Equal(got, []string{"b"}) {
		t.Errorf("after releasing a: %v", got)
	}
	if err := s.Release("b"); err != nil {
		t.Fatal(err)
	}
	for _, u := range Usage(s.Topology(), s.Policy(), snapshot(t, s)) {
		if u.VCPUs != 0 || u.MemoryMiB != 0 || len(u.DedicatedCPUs) != 0 || u.VMs != 0 {
			t.Errorf("node %d still used: %+v", u.Node, u)
		}
	}

	// The file is the documented JSON: version, generation, reservations.
	var st stateFile
	b2, _ := os.ReadFile(s.file.Path())
	if err := json.Unmarshal(b2, &st); err != nil || st.Version != 1 || st.Generation != 4 || len(st.Reservations) != 0 {
		t.Errorf("state file %s: %+v, %v", b2, st, err)
	}
}

func TestStoreRejectsLikePlace(t *testing.T) {
	s := newTestStore(t, uniform(2, 4, 8), Policy{})
	if _, err := s.Reserve(Request{Owner: "big", VCPUs: 1, MemoryMiB: 9 * 1024}); !errdefs.IsResourceExhausted(err) ||
		!strings.Contains(err.Error(), "VM big needs 9 GiB but the largest NUMA node has 8 GiB") {
		t.Errorf("too big: %v", err)
	}
	if _, err := s.Reserve(Request{VCPUs: 1, MemoryMiB: 1}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("no owner: %v", err)
	}
	if len(snapshot(t, s)) != 0 {
		t.Error("a rejected Reserve left a reservation")
	}
}

func TestOpenStoreValidates(t *testing.T) {
	topo := fakeTopology(t, uniform(1, 2, 1))
	if _, err := OpenStore(filepath.Join(t.TempDir(), "s"), topo, Policy{MemThreshold: -0.5}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad policy: %v", err)
	}
	if _, err := OpenStore(filepath.Join(t.TempDir(), "s"), &Topology{}, Policy{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("empty topology: %v", err)
	}
	s, err := OpenStore(filepath.Join(t.TempDir(), "missing-dir", "s"), topo, Policy{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reserve(Request{Owner: "a", VCPUs: 1, MemoryMiB: 1}); err == nil || !strings.Contains(err.Error(), "missing-dir") {
		t.Errorf("Reserve without the directory: %v", err)
	}
}

func TestStoreReconcile(t *testing.T) {
	s := newTestStore(t, uniform(2, 4, 8), Policy{})
	dead := holder{Pid: 1 << 30, Start: 1}
	s.alive = func(h holder) bool { return h != dead }

	reserve := func(owner string, vcpus int, mode Mode) Placement {
		t.Helper()
		pl, err := s.Reserve(Request{Owner: owner, VCPUs: vcpus, MemoryMiB: 1024, Mode: mode})
		if err != nil {
			t.Fatal(err)
		}
		return pl
	}
	defined := reserve("defined", 2, ModeDedicated)
	reserve("leaked", 2, ModeDedicated)
	reserve("inflight", 1, ModeNode)
	// "leaked" and "defined" were reserved by a shim that died since.
	if err := s.update(func(st *rawState) (bool, error) {
		for i := range st.lines {
			res, err := st.decode(i)
			if err != nil {
				return false, err
			}
			if res.Owner != "inflight" {
				res.Holder = &dead
			}
			st.lines[i], _ = json.Marshal(res)
		}
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	// libvirt knows "defined", and "unknown" whose reservation was lost.
	unknown := Placement{Owner: "unknown", Mode: ModeNode, VCPUs: 1, MemoryMiB: 512, Nodes: []int{1}, CPUs: []int{4, 5, 6, 7}}
	dropped, err := s.Reconcile([]Placement{defined, unknown})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(dropped, []string{"leaked"}) {
		t.Errorf("dropped %v, want [leaked]", dropped)
	}
	got := snapshot(t, s)
	if !slices.Equal(owners(got), []string{"unknown", "defined", "inflight"}) {
		t.Fatalf("after Reconcile: %v", owners(got))
	}
	// The leaked dedicated CPUs are free again: a 2-CPU dedicated VM fits.
	if _, err := s.Reserve(Request{Owner: "next", VCPUs: 2, MemoryMiB: 1, Mode: ModeDedicated}); err != nil {
		t.Errorf("leaked CPUs not freed: %v", err)
	}

	if _, err := s.Reconcile([]Placement{unknown, unknown}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("duplicate live owners: %v", err)
	}
	if _, err := s.Reconcile([]Placement{{VCPUs: 1}}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("live placement without owner: %v", err)
	}
	if len(snapshot(t, s)) != 4 {
		t.Errorf("a refused Reconcile changed the state")
	}
}

func TestStoreCorruptState(t *testing.T) {
	s := newTestStore(t, uniform(1, 4, 8), Policy{})
	if err := os.WriteFile(s.file.Path(), []byte(`{"version":1,"reserv`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reserve(Request{Owner: "a", VCPUs: 1, MemoryMiB: 1}); !errdefs.IsDataLoss(err) {
		t.Errorf("Reserve on a corrupt state: %v", err)
	}
	if _, err := s.Snapshot(); !errdefs.IsDataLoss(err) {
		t.Errorf("Snapshot of a corrupt state: %v", err)
	}
	live := Placement{Owner: "live", Mode: ModeNode, VCPUs: 1, MemoryMiB: 1, Nodes: []int{0}, CPUs: []int{0, 1, 2, 3}}
	if _, err := s.Reconcile([]Placement{live}); err != nil {
		t.Fatalf("Reconcile of a corrupt state: %v", err)
	}
	if got := snapshot(t, s); !reflect.DeepEqual(got, []Placement{live}) {
		t.Errorf("after Reconcile: %+v", got)
	}

	if err := os.WriteFile(s.file.Path(), []byte(`{"version":2,"reservations":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reserve(Request{Owner: "a", VCPUs: 1, MemoryMiB: 1}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Reserve on a newer format: %v", err)
	}
}

func TestHolderAlive(t *testing.T) {
	start, err := procfs.StartTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if !holderAlive(holder{Pid: os.Getpid(), Start: start}) {
		t.Error("this process is not alive")
	}
	if holderAlive(holder{Pid: os.Getpid(), Start: start + 1}) {
		t.Error("a reused pid counts as the same process")
	}
	if holderAlive(holder{Pid: 1 << 30, Start: start}) {
		t.Error("a pid that does not exist is alive")
	}
}

func TestDescribe(t *testing.T) {
	topo := fakeTopology(t, uniform(1, 4, 8))
	n1, err := Place(topo, Policy{}, nil, Request{Owner: "n1", VCPUs: 2, MemoryMiB: 2048})
	if err != nil {
		t.Fatal(err)
	}
	d1, err := Place(topo, Policy{}, []Placement{n1}, Request{Owner: "d1", VCPUs: 2, MemoryMiB: 1024, Mode: ModeDedicated})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := Describe(&b, topo, Policy{ReservedCPUs: []int{9}}, []Placement{n1, d1}); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		`policy: cpu_threshold 4, mem_threshold 1, min_shared_cpus 1, allow_spread false, reserved_cpus "9"`,
		"node  cpus  memory  distances  vms  vcpus/shared  dedicated  memory used  cpu ratio  mem ratio  |cpu-mem|\n",
		"0     0-3   8 GiB   10         2    2/2 (1.00)    2-3        3 GiB        1.00       0.38       0.62\n",
		"reservations: 2\n",
		"n1     node       0      2      2 GiB   0-3   -\n",
		"d1     dedicated  0      2      1 GiB   2-3   0\n",
		"overlap: n1 runs on CPUs 2-3 dedicated to d1 (stale cpuset, placed before the dedicated VM; re-pin it to its node's shared CPUs)\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("Describe output lacks %q:\n%s", want, out)
		}
	}
}

// A cleanup that releases a reservation while a new shim reconciles cannot
// have its release undone: the new shim lists the live domains under the
// state's lock, so the release (which follows the domain's undefine) waits
// for the reconcile and then wins. Found in the fault suite: a shim killed
// while starting, the next shim's reconcile put the gone VM's placement back.
func TestReconcileWithListsUnderTheLock(t *testing.T) {
	s := newTestStore(t, uniform(1, 4, 8), Policy{})
	gone, err := s.Reserve(Request{Owner: "gone", VCPUs: 1, MemoryMiB: 1, Mode: ModeNode})
	if err != nil {
		t.Fatal(err)
	}
	released := make(chan error, 1)
	_, err = s.ReconcileWith(func() ([]Placement, error) {
		// The listing still sees the domain; its cleanup releases now.
		go func() { released <- s.Release("gone") }()
		select {
		case releaseErr := <-released:
			t.Errorf("a Release went through during the reconcile: %v", releaseErr)
		case <-time.After(100 * time.Millisecond):
		}
		return []Placement{gone}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-released:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the Release never ran after the reconcile")
	}
	if got := owners(snapshot(t, s)); len(got) != 0 {
		t.Errorf("after the cleanup's release: %v, want none", got)
	}

	wantErr := errors.New("libvirt gone")
	if _, err := s.ReconcileWith(func() ([]Placement, error) { return nil, wantErr }); !errors.Is(err, wantErr) {
		t.Errorf("a failed listing: %v", err)
	}
}
