package shim

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kvm-shim/containerd-shim-kvm-v1/numa"
)

func cpuResources(quota int64) *specs.LinuxResources {
	period := uint64(100000)
	return &specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: &quota, Period: &period}}
}

func TestUpdateResourcesDecodes(t *testing.T) {
	b, _ := json.Marshal(cpuResources(200000))
	r, err := updateResources(&anypb.Any{TypeUrl: "types.containerd.io/opencontainers/runtime-spec/1/LinuxResources", Value: b})
	if err != nil || *r.CPU.Quota != 200000 {
		t.Fatalf("%+v, %v", r, err)
	}
	if _, err := updateResources(&anypb.Any{TypeUrl: "types.containerd.io/other", Value: b}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("foreign type: %v", err)
	}
	if _, err := updateResources(&anypb.Any{TypeUrl: "x/LinuxResources", Value: []byte("{")}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad JSON: %v", err)
	}
}

// A running VM grows within its maximum and shrinks through its guest
// agent: fewer vCPUs are taken offline in the guest (QEMU keeps them),
// more are onlined there first, then plugged into QEMU. The domain
// renders with room to grow.
func TestVMTaskUpdateVCPUs(t *testing.T) {
	f := newVMFixture(t)
	vt := f.started()
	if xml := f.fake.doms[vt.rec.Domain].xml; !strings.Contains(xml, `current="1">4</vcpu>`) {
		t.Errorf("domain has no room to grow:\n%s", xml)
	}
	ctx := context.Background()
	for _, step := range []struct {
		what          string
		quota         int64
		calls         []string // asked of libvirt, in order
		qemu, online  int
		plugged, live int // the task's record: online (vcpus) and plugged
	}{
		{"1.5 CPUs: plug one", 150000, []string{"setvcpus 2"}, 2, 2, 2, 2},
		{"1 CPU: the guest offlines CPU 1", 100000, []string{"setguestvcpus 1"}, 2, 1, 2, 1},
		{"2 CPUs: the guest onlines it again", 200000, []string{"setguestvcpus 2"}, 2, 2, 2, 2},
		{"1 CPU again", 100000, []string{"setguestvcpus 1"}, 2, 1, 2, 1},
		{"3 CPUs: online, then plug", 300000, []string{"setguestvcpus 2", "setvcpus 3"}, 3, 3, 3, 3},
		{"no CPU limit: nothing asked", 0, nil, 3, 3, 3, 3},
	} {
		before := len(f.fake.called())
		res := cpuResources(step.quota)
		if step.quota == 0 {
			res = &specs.LinuxResources{}
		}
		if err := vt.update(ctx, res); err != nil {
			t.Fatalf("%s: %v", step.what, err)
		}
		var calls []string
		for _, c := range f.fake.called()[before:] {
			calls = append(calls, strings.TrimSuffix(c, " "+vt.rec.Domain))
		}
		qemu, _ := f.fake.VCPUs(vt.rec.Domain)
		online, _ := f.fake.GuestVCPUs(vt.rec.Domain)
		if strings.Join(calls, ",") != strings.Join(step.calls, ",") || qemu != step.qemu || online != step.online ||
			vt.plugged != step.plugged || vt.vcpus != step.live {
			t.Errorf("%s: calls %q, QEMU %d vCPUs, guest %d online, task %d online of %d; want %q, %d, %d, %d of %d",
				step.what, calls, qemu, online, vt.vcpus, vt.plugged, step.calls, step.qemu, step.online, step.live, step.plugged)
		}
	}
}

// A shrink without an answering guest agent, or with a guest that keeps
// its CPUs, is refused naming linux.resources.cpu, the VM as it was.
func TestVMTaskUpdateShrinkRefused(t *testing.T) {
	for name, c := range map[string]struct {
		setup func(*fakeDomains)
		is    func(error) bool
		want  string
	}{
		"no agent": {func(f *fakeDomains) { f.guest.SetAbsent(true) }, errdefs.IsFailedPrecondition, "needs the QEMU guest agent"},
		"guest keeps its CPUs": {func(f *fakeDomains) { f.cpuStuck = true }, errdefs.IsFailedPrecondition,
			"the guest has 2 vCPUs online, asked for 1"},
	} {
		t.Run(name, func(t *testing.T) {
			f := newVMFixture(t)
			vt := f.started()
			ctx := context.Background()
			if err := vt.update(ctx, cpuResources(200000)); err != nil {
				t.Fatal(err)
			}
			c.setup(f.fake)
			err := vt.update(ctx, cpuResources(100000))
			if !c.is(err) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "linux.resources.cpu") {
				t.Fatalf("shrink to 1 vCPU: %v, want an error naming linux.resources.cpu and %q", err, c.want)
			}
			f.fake.guest.SetAbsent(false)
			qemu, _ := f.fake.VCPUs(vt.rec.Domain)
			online, _ := f.fake.GuestVCPUs(vt.rec.Domain)
			if qemu != 2 || online != 2 || vt.vcpus != 2 || vt.plugged != 2 {
				t.Errorf("after a refused shrink: QEMU %d, guest %d online, task %d of %d; want all 2", qemu, online, vt.vcpus, vt.plugged)
			}
		})
	}
}

// Growth that onlines the guest's offline vCPUs and then fails to plug
// more takes them offline again and unplugs what libvirt plugged.
func TestVMTaskUpdateGrowthUndone(t *testing.T) {
	f := newVMFixture(t)
	vt := f.started()
	ctx := context.Background()
	for _, q := range []int64{200000, 100000} {
		if err := vt.update(ctx, cpuResources(q)); err != nil {
			t.Fatal(err)
		}
	}
	f.fake.vcpuErr = errors.New("plug failed")
	if err := vt.update(ctx, cpuResources(300000)); err == nil || !strings.Contains(err.Error(), "plug failed") {
		t.Fatalf("growth whose plug fails: %v", err)
	}
	qemu, _ := f.fake.VCPUs(vt.rec.Domain)
	online, _ := f.fake.GuestVCPUs(vt.rec.Domain)
	if qemu != 2 || online != 1 || vt.vcpus != 1 || vt.plugged != 2 {
		t.Errorf("after a failed growth: QEMU %d, guest %d online, task %d of %d; want 2, 1, 1 of 2", qemu, online, vt.vcpus, vt.plugged)
	}
}

// Bad input and a VM that cannot take the change: a clear error naming
// the field, and the VM as it was.
func TestVMTaskUpdateRefused(t *testing.T) {
	limit := int64(1 << 30)
	for name, c := range map[string]struct {
		res   *specs.LinuxResources
		setup func(*vmFixture, *vmTask)
		is    func(error) bool
		want  string
	}{
		"above the maximum": {res: cpuResources(500000), is: errdefs.IsInvalidArgument, want: "linux.resources.cpu"},
		"memory without a maximum": {res: &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}}, is: errdefs.IsInvalidArgument,
			want: "linux.resources.memory.limit"},
		"paused": {res: cpuResources(200000), is: errdefs.IsFailedPrecondition, want: "paused",
			setup: func(f *vmFixture, vt *vmTask) { _ = vt.pause(context.Background()) }},
		"libvirt fails": {res: cpuResources(300000), is: func(err error) bool { return strings.Contains(err.Error(), "guest refused") },
			want:  "3 vCPUs",
			setup: func(f *vmFixture, vt *vmTask) { f.fake.vcpuErr = errors.New("guest refused") }},
	} {
		t.Run(name, func(t *testing.T) {
			f := newVMFixture(t)
			vt := f.started()
			if c.setup != nil {
				c.setup(f, vt)
			}
			err := vt.update(context.Background(), c.res)
			if err == nil || !c.is(err) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error naming %q", err, c.want)
			}
			f.fake.vcpuErr = nil
			if n, _ := f.fake.VCPUs(vt.rec.Domain); vt.vcpus != 1 || (n != 0 && n != 1) {
				t.Errorf("after a refused resize: task %d vCPUs, domain %d; want 1", vt.vcpus, n)
			}
		})
	}
	f := newVMFixture(t)
	vt := f.created()
	if err := vt.update(context.Background(), cpuResources(200000)); !errdefs.IsFailedPrecondition(err) ||
		!strings.Contains(err.Error(), "created") {
		t.Errorf("resize before start: %v", err)
	}
}

// A plug that libvirt fails puts the VM back as it was.
func TestVMTaskUpdateFailedPlug(t *testing.T) {
	f := newVMFixture(t)
	vt := f.started()
	f.fake.lateErr = errors.New("vcpu plug failed")
	if err := vt.update(context.Background(), cpuResources(200000)); err == nil || vt.vcpus != 1 {
		t.Errorf("plug that failed: %v, task has %d vCPUs", err, vt.vcpus)
	}
	if n, _ := f.fake.VCPUs(vt.rec.Domain); n != 1 {
		t.Errorf("after a failed plug the domain has %d vCPUs, want 1", n)
	}
}

// The NUMA reservation follows the vCPUs online in the guest: it shrinks
// with an offline, grows before an online or a plug, and a growth the node
// has no room for is ResourceExhausted with nothing asked of the guest.
func TestVMTaskUpdateVCPUsNUMA(t *testing.T) {
	f := newVMFixture(t)
	f.host.cfg.NUMAStateFile = filepath.Join(t.TempDir(), "numa.json")
	topo := &numa.Topology{Nodes: []numa.Node{{ID: 0, CPUs: []int{0, 1}, MemoryBytes: 8 << 30, Distances: []int{10}}}}
	store, err := numa.OpenStore(f.host.cfg.NUMAStateFile, topo, numa.Policy{CPUThreshold: 1.5, MemThreshold: 1})
	if err != nil {
		t.Fatal(err)
	}
	f.host.numa = store
	vt := f.started()
	reserved := func() int {
		ps, err := store.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			if p.Owner == vt.rec.NUMAOwner {
				return p.VCPUs
			}
		}
		return 0
	}
	ctx := context.Background()
	for _, step := range []struct {
		quota      int64
		noAgent    bool
		is         func(error) bool
		want, live int
	}{
		{quota: 200000, want: 2, live: 2},
		{quota: 100000, want: 1, live: 1},
		{quota: 300000, want: 3, live: 3}, // 3 vCPUs fit 2 CPUs at 1.5 each
		{quota: 100000, want: 1, live: 1},
		{quota: 200000, noAgent: true, is: errdefs.IsFailedPrecondition, want: 1, live: 1},
		{quota: 400000, is: errdefs.IsResourceExhausted, want: 1, live: 1},
	} {
		f.fake.guest.SetAbsent(step.noAgent)
		calls := len(f.fake.called())
		err := vt.update(ctx, cpuResources(step.quota))
		if step.is == nil && err != nil || step.is != nil && !step.is(err) {
			t.Fatalf("to %d vCPUs: %v", step.quota/100000, err)
		}
		if got := reserved(); got != step.want || vt.vcpus != step.live {
			t.Errorf("to %d vCPUs (%v): reservation %d vCPUs, task %d online; want %d, %d", step.quota/100000, err, got, vt.vcpus, step.want,
				step.live)
		}
		if errdefs.IsResourceExhausted(err) && len(f.fake.called()) != calls {
			t.Errorf("a growth without room asked %v", f.fake.called()[calls:])
		}
	}
}
