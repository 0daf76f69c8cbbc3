package shim

import (
	"os"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
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
	cfg := DefaultConfig()
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
			v, m, err := vmSize(tc.spec, cfg)
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
	cfg := DefaultConfig()
	if got, _ := kernelCmdline(&specs.Spec{}, cfg); got != cfg.KernelCmdline {
		t.Errorf("default: %q", got)
	}
	s := &specs.Spec{Annotations: map[string]string{annotations.KernelCmdline: "console=ttyS0 quiet"}}
	if got, _ := kernelCmdline(s, cfg); got != "console=ttyS0 quiet" {
		t.Errorf("annotation: %q", got)
	}
	s.Annotations[annotations.KernelCmdline] = "a\nb"
	if _, err := kernelCmdline(s, cfg); !errdefs.IsInvalidArgument(err) {
		t.Errorf("newline accepted: %v", err)
	}
}

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(body string) string {
		p := dir + "/c.toml"
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfg, err := LoadConfig(write("accel = \"tcg\"\nstate_dir = \"/srv/kvm\"\ndefault_memory_mib = 256\n"))
	if err != nil || cfg.Accel != "tcg" || cfg.StateDir != "/srv/kvm" || cfg.DefaultMemoryMiB != 256 || cfg.Machine != "q35" {
		t.Fatalf("got %+v, %v", cfg, err)
	}
	for body, want := range map[string]string{
		"acel = \"tcg\"\n":           "acel",
		"accel = \"hvf\"\n":          "hvf",
		"state_dir = \"relative\"\n": "state_dir",
		"default_vcpus = 0\n":        "default_vcpus",
		"accel = \n":                 "c.toml",
	} {
		if _, err := LoadConfig(write(body)); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: want InvalidArgument naming %q, got %v", body, want, err)
		}
	}
	if _, err := LoadConfig(dir + "/missing.toml"); err == nil {
		t.Error("a missing explicit config was accepted")
	}
}

// The shipped example must parse and document exactly the defaults.
func TestExampleConfigIsDefaults(t *testing.T) {
	cfg, err := LoadConfig("../config.example.toml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg != DefaultConfig() {
		t.Errorf("config.example.toml differs from DefaultConfig():\n%+v\n%+v", cfg, DefaultConfig())
	}
}
