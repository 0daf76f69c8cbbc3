package vmplan

import (
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
	"github.com/kvm-shim/containerd-shim-kvm-v1/config"
	"github.com/kvm-shim/containerd-shim-kvm-v1/numa"
)

func TestHotplugMaxVCPUs(t *testing.T) {
	cfg := config.Default() // hotplug_max_vcpus 4, max_vcpus 64
	for _, c := range []struct {
		ann   string
		vcpus int
		mode  numa.Mode
		want  int
		err   bool
	}{
		{"", 1, numa.ModeNode, 4, false},
		{"", 6, numa.ModeNode, 6, false},
		{"", 1, numa.ModeDedicated, 1, false},
		{"8", 2, numa.ModeNode, 8, false},
		{"2", 2, numa.ModeDedicated, 2, false},
		{"1", 2, numa.ModeNode, 0, true},
		{"65", 2, numa.ModeNode, 0, true},
		{"four", 2, numa.ModeNode, 0, true},
		{"4", 2, numa.ModeDedicated, 0, true},
	} {
		spec := &specs.Spec{Annotations: map[string]string{}}
		if c.ann != "" {
			spec.Annotations[annotations.MaxVCPUs] = c.ann
		}
		got, err := HotplugMaxVCPUs(spec, cfg, c.vcpus, c.mode)
		if c.err {
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), annotations.MaxVCPUs) {
				t.Errorf("%q with %d vCPUs (%s): %v, want InvalidArgument naming the annotation", c.ann, c.vcpus, c.mode, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%q with %d vCPUs (%s) = %d, %v; want %d", c.ann, c.vcpus, c.mode, got, err, c.want)
		}
	}
}

func TestHotplugMaxMemoryMiB(t *testing.T) {
	cfg := config.Default() // hotplug_max_memory_mib 0, max_memory_mib 256 GiB
	for _, c := range []struct {
		ann  string
		mem  int
		mode numa.Mode
		want int
		bad  bool
	}{
		{"", 512, numa.ModeNode, 512, false},
		{"2048", 512, numa.ModeNode, 2048, false},
		{" 1024 ", 512, numa.ModeNone, 1024, false},
		{"512", 512, numa.ModeDedicated, 512, false},
		{"256", 512, numa.ModeNode, 0, true},
		{"2Gi", 512, numa.ModeNode, 0, true},
		{"-1", 512, numa.ModeNode, 0, true},
		{"999999999", 512, numa.ModeNode, 0, true},
		{"1024", 512, numa.ModeDedicated, 0, true},
	} {
		spec := &specs.Spec{Annotations: map[string]string{}}
		if c.ann != "" {
			spec.Annotations[annotations.MaxMemoryMiB] = c.ann
		}
		got, err := HotplugMaxMemoryMiB(spec, cfg, c.mem, c.mode)
		if c.bad {
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), annotations.MaxMemoryMiB) {
				t.Errorf("%q: %v, want InvalidArgument naming the annotation", c.ann, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%q mem %d %s: %d, %v; want %d", c.ann, c.mem, c.mode, got, err, c.want)
		}
	}
	cfg.HotplugMaxMemoryMiB = 4096
	if got, _ := HotplugMaxMemoryMiB(&specs.Spec{}, cfg, 512, numa.ModeNode); got != 4096 {
		t.Errorf("config default: %d, want 4096", got)
	}
	if got, _ := HotplugMaxMemoryMiB(&specs.Spec{}, cfg, 8192, numa.ModeNode); got != 8192 {
		t.Errorf("a VM above the config default: %d, want its own 8192", got)
	}
}
