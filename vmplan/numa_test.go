package vmplan

import (
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
	"github.com/kvm-shim/containerd-shim-kvm-v1/config"
	"github.com/kvm-shim/containerd-shim-kvm-v1/numa"
)

func TestPinningFromPlacement(t *testing.T) {
	if p := Pinning(numa.Placement{Mode: numa.ModeNone}); p != nil {
		t.Errorf("mode none pinned: %+v", p)
	}
	ded := Pinning(numa.Placement{Mode: numa.ModeDedicated, VCPUs: 2, Nodes: []int{1}, CPUs: []int{6, 7}, VCPUPins: []int{7, 6},
		EmulatorCPUs: []int{4}})
	if !reflect.DeepEqual(ded.VCPUPins, [][]int{{7}, {6}}) || !reflect.DeepEqual(ded.EmulatorCPUs, []int{4}) ||
		!reflect.DeepEqual(ded.MemoryNodes, []int{1}) {
		t.Errorf("dedicated: %+v", ded)
	}
	spread := Pinning(numa.Placement{Mode: numa.ModeNode, VCPUs: 3, Nodes: []int{0, 1}, GuestNodes: []numa.GuestNode{
		{HostNode: 0, VCPUs: []int{0, 1}, MemoryMiB: 512, CPUs: []int{0, 1}},
		{HostNode: 1, VCPUs: []int{2}, MemoryMiB: 256, CPUs: []int{2, 3}},
	}})
	if !reflect.DeepEqual(spread.VCPUPins, [][]int{{0, 1}, {0, 1}, {2, 3}}) || len(spread.Cells) != 2 || spread.Cells[1].HostNode != 1 {
		t.Errorf("spread: %+v", spread)
	}
}

func TestNUMAModeAndHugePages(t *testing.T) {
	cfg := config.Default()
	if m, err := NUMAMode(&specs.Spec{}, cfg); err != nil || m != numa.ModeNode {
		t.Errorf("default: %v, %v", m, err)
	}
	s := &specs.Spec{Annotations: map[string]string{annotations.NUMAMode: "fast"}}
	if _, err := NUMAMode(s, cfg); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), annotations.NUMAMode) {
		t.Errorf("bad mode: %v", err)
	}
	limit := &specs.Spec{Linux: &specs.Linux{Resources: &specs.LinuxResources{HugepageLimits: []specs.LinuxHugepageLimit{{Pagesize: "2MB",
		Limit: 1 << 30}}}}}
	if kib, err := HugePageKiB(limit); err != nil || kib != 2048 {
		t.Errorf("2MB pages: %d, %v", kib, err)
	}
	limit.Linux.Resources.HugepageLimits[0].Pagesize = "64KB"
	if _, err := HugePageKiB(limit); !errdefs.IsInvalidArgument(err) {
		t.Errorf("64KB pages: %v", err)
	}
}
