package shim

import (
	"context"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
)

func memResources(mib int64) *specs.LinuxResources {
	limit := mib * 1024 * 1024
	return &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}}
}

// memVM is a started VM of 512 MiB that may grow to 1536 MiB.
func memVM(t *testing.T) (*vmFixture, *vmTask) {
	f := newVMFixture(t)
	f.kernelRootfs()
	vt, err := f.create(map[string]string{annotations.MaxMemoryMiB: "1536"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := vt.start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return f, vt
}

func TestVMTaskUpdateMemory(t *testing.T) {
	f, vt := memVM(t)
	xml := f.fake.doms[vt.rec.Domain].xml
	for _, want := range []string{`<maxMemory unit="MiB" slots="1">1536</maxMemory>`, `<memory model="virtio-mem">`,
		`<size unit="KiB">1048576</size>`} {
		if !strings.Contains(xml, want) {
			t.Errorf("domain lacks %s:\n%s", want, xml)
		}
	}
	ctx := context.Background()
	// 700 MiB: 188 MiB hot-added, in whole 2 MiB blocks.
	if err := vt.update(ctx, memResources(700)); err != nil {
		t.Fatal(err)
	}
	if p, _ := f.fake.Plugged(vt.rec.Domain); p.CurrentMiB != 188 || vt.memMiB != 700 {
		t.Errorf("after 700 MiB: %d MiB plugged, task says %d MiB", p.CurrentMiB, vt.memMiB)
	}
	if st, err := vt.stats(ctx); err != nil || st.MemoryBytes != 700<<20 {
		t.Errorf("stats after 700 MiB: memory %d MiB, %v; want the boot 512 + 188 plugged", st.MemoryBytes>>20, err)
	}
	// vCPUs and memory together.
	res := memResources(1536)
	res.CPU = cpuResources(200000).CPU
	if err := vt.update(ctx, res); err != nil {
		t.Fatal(err)
	}
	if p, _ := f.fake.Plugged(vt.rec.Domain); p.CurrentMiB != 1024 || vt.memMiB != 1536 || vt.vcpus != 2 {
		t.Errorf("after 2 vCPUs, 1536 MiB: %d MiB plugged, task %d MiB %d vCPUs", p.CurrentMiB, vt.memMiB, vt.vcpus)
	}
	// The guest gives memory back: the device shrinks.
	if err := vt.update(ctx, memResources(512)); err != nil {
		t.Fatal(err)
	}
	if p, _ := f.fake.Plugged(vt.rec.Domain); p.CurrentMiB != 0 || vt.memMiB != 512 {
		t.Errorf("after 512 MiB: %d MiB plugged, task says %d MiB", p.CurrentMiB, vt.memMiB)
	}
}

// Memory the VM cannot take, or a guest that does not follow: an error
// naming the field, and the VM (vCPUs, memory) as it was.
func TestVMTaskUpdateMemoryRefused(t *testing.T) {
	for name, c := range map[string]struct {
		res   *specs.LinuxResources
		stuck bool
		is    func(error) bool
		want  string
	}{
		"above the maximum":     {res: memResources(2048), is: errdefs.IsInvalidArgument, want: "linux.resources.memory.limit"},
		"below the boot memory": {res: memResources(256), is: errdefs.IsFailedPrecondition, want: "linux.resources.memory.limit"},
		"guest does not plug": {res: memResources(1024), stuck: true, is: errdefs.IsFailedPrecondition,
			want: "linux.resources.memory.limit"},
		"guest does not plug, cpu": {res: func() *specs.LinuxResources { r := memResources(1024); r.CPU = cpuResources(200000).CPU; return r }(),
			stuck: true, is: errdefs.IsFailedPrecondition, want: "1024 MiB"},
	} {
		t.Run(name, func(t *testing.T) {
			f, vt := memVM(t)
			f.fake.memStuck = c.stuck
			err := vt.update(context.Background(), c.res)
			if err == nil || !c.is(err) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error naming %q", err, c.want)
			}
			p, _ := f.fake.Plugged(vt.rec.Domain)
			n, _ := f.fake.VCPUs(vt.rec.Domain)
			if vt.memMiB != 512 || p.RequestedMiB != 0 || p.CurrentMiB != 0 || vt.vcpus != 1 || n > 1 {
				t.Errorf("after a refused resize: task %d MiB %d vCPUs, device %+v, domain %d vCPUs; want 512 MiB, 1 vCPU, nothing plugged", vt.memMiB,
					vt.vcpus, p, n)
			}
		})
	}
}

// A guest that cannot give memory back in time keeps what it had.
func TestVMTaskUpdateMemoryShrinkRefused(t *testing.T) {
	f, vt := memVM(t)
	if err := vt.update(context.Background(), memResources(1024)); err != nil {
		t.Fatal(err)
	}
	f.fake.memStuck = true
	err := vt.update(context.Background(), memResources(600))
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "linux.resources.memory.limit") {
		t.Fatalf("stuck unplug: %v", err)
	}
	if p, _ := f.fake.Plugged(vt.rec.Domain); p.RequestedMiB != 512 || vt.memMiB != 1024 {
		t.Errorf("after a refused shrink: device %+v, task %d MiB; want 512 MiB requested, 1024", p, vt.memMiB)
	}
}
