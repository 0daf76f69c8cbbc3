package numa

import (
	"testing"

	"github.com/containerd/errdefs"
)

func TestStoreResize(t *testing.T) {
	// One node of 2 CPUs, cpu_threshold 2: 4 floating vCPUs fit.
	s := newTestStore(t, uniform(1, 2, 8), Policy{CPUThreshold: 2})
	a, err := s.Reserve(Request{Owner: "a", VCPUs: 1, MemoryMiB: 512})
	if err != nil {
		t.Fatal(err)
	}
	if _, err = s.Reserve(Request{Owner: "b", VCPUs: 2, MemoryMiB: 512}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Resize("a", 2, 512)
	if err != nil || got.VCPUs != 2 || got.Nodes[0] != a.Nodes[0] || got.CPUs.String() != a.CPUs.String() {
		t.Fatalf("grow a to 2: %+v, %v; want the same node and CPUs", got, err)
	}
	if u := Usage(s.Topology(), s.Policy(), snapshot(t, s)); u[0].VCPUs != 4 {
		t.Errorf("node 0 holds %d vCPUs after the resize, want 4", u[0].VCPUs)
	}
	// A third vCPU for a would make 5 on 2 CPUs × 2: refused, unchanged.
	if _, err = s.Resize("a", 3, 512); !errdefs.IsResourceExhausted(err) {
		t.Errorf("grow past cpu_threshold: %v, want ResourceExhausted", err)
	}
	if ps := snapshot(t, s); ps[0].VCPUs != 2 {
		t.Errorf("a refused resize changed a to %d vCPUs", ps[0].VCPUs)
	}
	if got, resizeErr := s.Resize("a", 1, 512); resizeErr != nil || got.VCPUs != 1 {
		t.Errorf("shrink a to 1: %+v, %v", got, resizeErr)
	}
	if _, err = s.Resize("a", 0, 512); !errdefs.IsInvalidArgument(err) {
		t.Errorf("resize to 0: %v", err)
	}
	if _, err = s.Resize("nobody", 2, 512); !errdefs.IsNotFound(err) {
		t.Errorf("resize of no reservation: %v", err)
	}
	// Memory grows on the node while it has room (8 GiB here), and
	// cannot go past it.
	if got, resizeErr := s.Resize("a", 1, 4096); resizeErr != nil || got.MemoryMiB != 4096 {
		t.Errorf("grow a to 4096 MiB: %+v, %v", got, resizeErr)
	}
	if u := Usage(s.Topology(), s.Policy(), snapshot(t, s)); u[0].MemoryMiB != 4096+512 {
		t.Errorf("node 0 holds %d MiB after the memory resize, want %d", u[0].MemoryMiB, 4096+512)
	}
	if _, err = s.Resize("a", 1, 64*1024); !errdefs.IsResourceExhausted(err) {
		t.Errorf("grow past the node's memory: %v, want ResourceExhausted", err)
	}
	if ps := snapshot(t, s); ps[0].MemoryMiB != 4096 {
		t.Errorf("a refused resize changed a to %d MiB", ps[0].MemoryMiB)
	}
	if _, err = s.Resize("a", 1, 0); !errdefs.IsInvalidArgument(err) {
		t.Errorf("resize to 0 MiB: %v", err)
	}
	if _, err = s.Resize("a", 1, 512); err != nil {
		t.Fatal(err)
	}
	// Summaries stay what the reservations add up to.
	if u := Usage(s.Topology(), s.Policy(), snapshot(t, s)); u[0].VCPUs != 3 {
		t.Errorf("node 0 holds %d vCPUs, want 3", u[0].VCPUs)
	}
	sums, err := s.readRaw()
	if err != nil {
		t.Fatal(err)
	}
	if sums.header.Nodes[0].VCPUs != 3 {
		t.Errorf("state summary says %d vCPUs on node 0, want 3", sums.header.Nodes[0].VCPUs)
	}

	d := newTestStore(t, uniform(1, 4, 8), Policy{})
	if _, err := d.Reserve(Request{Owner: "d", VCPUs: 1, MemoryMiB: 512, Mode: ModeDedicated}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Resize("d", 2, 512); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("resize of a dedicated VM: %v, want FailedPrecondition", err)
	}
}
