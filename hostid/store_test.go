package hostid

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/errdefs"
)

func TestParseRange(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Range
		wantErr string
	}{
		{in: DefaultRange, want: Range{1000000000, 1000065535}},
		{in: " 70000 - 70000 ", want: Range{70000, 70000}},
		{in: "70000", wantErr: "want FIRST-LAST"},
		{in: "x-70000", wantErr: "first id"},
		{in: "70000-y", wantErr: "last id"},
		{in: "70010-70000", wantErr: "last id is below the first"},
		{in: "1000-70000", wantErr: "starts below 65536"},
		{in: "65534-70000", wantErr: "starts below 65536"},
		{in: "70000-4294967295", wantErr: "4294967295 is the invalid id -1"},
		{in: "70000-4294967296", wantErr: "last id"},
		{in: "-5-70000", wantErr: "first id"},
	} {
		got, err := ParseRange(tc.in)
		if tc.wantErr != "" {
			if err == nil || !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseRange(%q) = %v, %v; want an InvalidArgument error with %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseRange(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func newStore(t *testing.T, dir string, r Range) *Store {
	t.Helper()
	s, err := OpenStore(filepath.Join(dir, "ids.json"), r)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestAllocateDistinctIdempotentAndRoundRobin(t *testing.T) {
	s := newStore(t, t.TempDir(), Range{70000, 70002})
	a, err := s.Allocate("a")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := s.Allocate("b")
	if a != 70000 || b != 70001 {
		t.Fatalf("first ids = %d, %d; want 70000, 70001", a, b)
	}
	if again, _ := s.Allocate("a"); again != a {
		t.Fatalf("second Allocate of a = %d, want %d", again, a)
	}
	if err := s.Release("a"); err != nil {
		t.Fatal(err)
	}
	// 70000 is free again, but the next id goes on round the range.
	c, _ := s.Allocate("c")
	if c != 70002 {
		t.Fatalf("after freeing 70000 the next id = %d, want 70002 (freed ids come back last)", c)
	}
	d, _ := s.Allocate("d")
	if d != 70000 {
		t.Fatalf("the range wrapped to %d, want the freed 70000", d)
	}
	if _, err := s.Allocate("e"); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("Allocate in a full range = %v, want ResourceExhausted", err)
	}
	if err := s.Release("nobody-holds-this"); err != nil {
		t.Fatalf("Release of an unknown owner = %v", err)
	}
	snap, _ := s.Snapshot()
	if len(snap) != 3 || snap["b"] != 70001 || snap["c"] != 70002 || snap["d"] != 70000 {
		t.Fatalf("snapshot = %v", snap)
	}
}

// Shims allocate at once, each its own Store on one file: no id twice.
func TestAllocateConcurrentStores(t *testing.T) {
	dir := t.TempDir()
	const n = 40
	ids := make([]uint32, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := newStore(t, dir, Range{70000, 70000 + n - 1})
			id, err := s.Allocate(fmt.Sprintf("vm%d", i))
			if err != nil {
				t.Error(err)
			}
			ids[i] = id
		}()
	}
	wg.Wait()
	seen := map[uint32]int{}
	for i, id := range ids {
		if j, dup := seen[id]; dup {
			t.Fatalf("vm%d and vm%d both got id %d", j, i, id)
		}
		seen[id] = i
	}
}

func TestReconcile(t *testing.T) {
	dir := t.TempDir()
	s := newStore(t, dir, Range{70000, 70099})
	dead := holder{Pid: 1 << 30, Start: 1}
	s.alive = func(h holder) bool { return h != dead }
	for _, o := range []string{"defined", "between", "crashed", "clash"} {
		if _, err := s.Allocate(o); err != nil {
			t.Fatal(err)
		}
	}
	// "crashed" was allocated by a shim that died before defining its
	// domain; "clash" by a live one, but a domain runs under its id.
	crashed := *s
	crashed.self = dead
	if _, err := crashed.Allocate("crashed"); err != nil {
		t.Fatal(err)
	}
	snap, _ := s.Snapshot()
	dropped, err := s.ReconcileWith(func() (map[string]uint32, error) {
		return map[string]uint32{"defined": snap["defined"], "adopted": snap["clash"]}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := s.Snapshot()
	want := map[string]uint32{"defined": snap["defined"], "adopted": snap["clash"], "between": snap["between"]}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after reconcile: %v, want %v", got, want)
	}
	if fmt.Sprint(dropped) != "[crashed clash]" {
		t.Fatalf("dropped = %v, want [crashed clash]", dropped)
	}
	// A corrupt file is replaced by what libvirt has.
	if err := os.WriteFile(filepath.Join(dir, "ids.json"), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Allocate("x"); !errdefs.IsDataLoss(err) {
		t.Fatalf("Allocate on a corrupt state = %v, want DataLoss", err)
	}
	if _, err := s.ReconcileWith(func() (map[string]uint32, error) { return map[string]uint32{"defined": 70005}, nil }); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Snapshot(); len(got) != 1 || got["defined"] != 70005 {
		t.Fatalf("after reconciling a corrupt state: %v", got)
	}
}
