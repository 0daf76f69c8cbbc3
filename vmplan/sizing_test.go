package vmplan

import (
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
	"github.com/kvm-shim/containerd-shim-kvm-v1/config"
)

func specWith(quota int64, period uint64, limit int64, ann map[string]string) *specs.Spec {
	s := &specs.Spec{Annotations: ann, Linux: &specs.Linux{Resources: &specs.LinuxResources{}}}
	if period > 0 {
		s.Linux.Resources.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
	}
	if limit > 0 {
		s.Linux.Resources.Memory = &specs.LinuxMemory{Limit: &limit}
	}
	return s
}

func TestVMSize(t *testing.T) {
	cfg := config.Default()
	cases := []struct {
		name       string
		spec       *specs.Spec
		vcpus, mem int
		errWants   string
	}{
		{"defaults", &specs.Spec{}, 1, 512, ""},
		{"limits", specWith(250000, 100000, 1<<30, nil), 3, 1024, ""},
		{"memory rounds up", specWith(0, 0, 100*mib+1, nil), 1, 101, ""},
		{"annotations win", specWith(100000, 100000, 1<<30, map[string]string{annotations.VCPUs: "4", annotations.Memory: "2Gi"}), 4, 2048, ""},
		{"decimal suffix", specWith(0, 0, 0, map[string]string{annotations.Memory: "1G"}), 1, 954, ""},
		{"bytes", specWith(0, 0, 0, map[string]string{annotations.Memory: "268435456"}), 1, 256, ""},
		{"bad memory", specWith(0, 0, 0, map[string]string{annotations.Memory: "lots"}), 0, 0, annotations.Memory},
		{"negative memory", specWith(0, 0, 0, map[string]string{annotations.Memory: "-1Gi"}), 0, 0, annotations.Memory},
		{"tiny memory", specWith(0, 0, 0, map[string]string{annotations.Memory: "1Mi"}), 0, 0, annotations.Memory},
		{"overflow", specWith(0, 0, 0, map[string]string{annotations.Memory: "9999999999999Ti"}), 0, 0, annotations.Memory},
		{"bad vcpus", specWith(0, 0, 0, map[string]string{annotations.VCPUs: "two"}), 0, 0, annotations.VCPUs},
		{"zero vcpus", specWith(0, 0, 0, map[string]string{annotations.VCPUs: "0"}), 0, 0, annotations.VCPUs},
		{"too many vcpus", specWith(0, 0, 0, map[string]string{annotations.VCPUs: "65"}), 0, 0, annotations.VCPUs},
		{"limit too small", specWith(0, 0, 32*mib, nil), 0, 0, "linux.resources.memory.limit"},
		{"quota too large", specWith(100*100000, 100000, 0, nil), 0, 0, "max_vcpus"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, m, err := Size(tc.spec, cfg)
			if tc.errWants != "" {
				if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.errWants) {
					t.Fatalf("want InvalidArgument naming %q, got %v", tc.errWants, err)
				}
				return
			}
			if err != nil || v != tc.vcpus || m != tc.mem {
				t.Fatalf("got %d vCPUs, %d MiB, %v; want %d, %d", v, m, err, tc.vcpus, tc.mem)
			}
		})
	}
}

func TestKernelCmdline(t *testing.T) {
	cfg := config.Default()
	if got, _ := KernelCmdline(&specs.Spec{}, cfg); got != cfg.KernelCmdline {
		t.Errorf("default: %q", got)
	}
	s := &specs.Spec{Annotations: map[string]string{annotations.KernelCmdline: "console=ttyS0 quiet"}}
	if got, _ := KernelCmdline(s, cfg); got != "console=ttyS0 quiet" {
		t.Errorf("annotation: %q", got)
	}
	s.Annotations[annotations.KernelCmdline] = "a\nb"
	if _, err := KernelCmdline(s, cfg); !errdefs.IsInvalidArgument(err) {
		t.Errorf("newline accepted: %v", err)
	}
}
