package shim

import (
	"errors"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
	"github.com/kvm-shim/containerd-shim-kvm-v1/numa"
)

// TestCreateFullNodeNamesTheResource: a VM the node's NUMA capacity
// cannot take is ResourceExhausted, says how many of the node's
// kvm.containerd.io/vcpu it takes (what its pod should request), and
// leaves no reservation or domain.
func TestCreateFullNodeNamesTheResource(t *testing.T) {
	f := planFixture(t)
	if _, err := f.host.numa.Reserve(numa.Request{Owner: "other", VCPUs: 15, MemoryMiB: 64}); err != nil {
		t.Fatal(err)
	}
	spec := &specs.Spec{Annotations: map[string]string{annotations.VCPUs: "2"}}
	_, err := f.createSpec(spec)
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "takes 2 of the node's "+numa.VCPUResource) {
		t.Fatalf("err = %v, want ResourceExhausted naming the 2 %s it takes", err, numa.VCPUResource)
	}
	ps, err := f.host.numa.Snapshot()
	if err != nil || len(ps) != 1 || len(f.fake.doms) != 0 {
		t.Fatalf("after the refusal: reservations %+v (%v), domains %d; want the other VM's only", ps, err, len(f.fake.doms))
	}
}
