package vmplan

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
	"github.com/kvm-shim/containerd-shim-kvm-v1/config"
	"github.com/kvm-shim/containerd-shim-kvm-v1/numa"
)

// FuzzPodAnnotations drives every kvm.containerd.io/ annotation the vmplan
// package reads (vcpus, memory, kernel-cmdline, numa-mode, max-vcpus,
// disk-images; the config drive's are fuzzed in configdrive) through the
// same functions Create uses. Run it with
//
//	go test -run='^$' -fuzz=FuzzPodAnnotations -fuzztime=30s ./vmplan/
//
// Properties: no panic; a refusal is InvalidArgument and names the
// annotation it refuses; what is accepted is within the config's limits
// (vCPUs 1..max_vcpus, memory config.MinMemoryMiB..max_memory_mib, max-vcpus
// between the VM's vCPUs and max_vcpus and never above vCPUs when
// dedicated, a command line of one line within the kernel's size, a known
// NUMA mode, disk-images of clean absolute paths and positive sizes).
// The seed corpus is below and in testdata/fuzz/FuzzPodAnnotations.
func FuzzPodAnnotations(f *testing.F) {
	f.Add("", "", "", "", "", "")
	f.Add("2", "512Mi", "console=ttyS0 quiet", "node", "4", "/data=1Gi")
	f.Add(" 64 ", "256Gi", "a\nb", "dedicated", "1", "/a=1Gi, /b/../c=512Mi")
	f.Add("0", "63Mi", "\x00", "none", "65", "data=1Gi")
	f.Add("-1", "9223372036854775807Ti", strings.Repeat("x", 2049), "NODE", "x", "/a=0")
	f.Add("1e3", "1.5Gi", "\r", " spread", "2 ", "/a=1Gi,,/b=2Gi")
	f.Add("99999999999999999999", "67108864", "", "", "", "/=1k")
	f.Fuzz(func(t *testing.T, vcpusA, memoryA, cmdlineA, numaA, maxA, disksA string) {
		ann := map[string]string{}
		for k, v := range map[string]string{
			annotations.VCPUs: vcpusA, annotations.Memory: memoryA, annotations.KernelCmdline: cmdlineA,
			annotations.NUMAMode: numaA, annotations.MaxVCPUs: maxA, annotations.DiskImages: disksA,
		} {
			if v != "" {
				ann[k] = v
			}
		}
		spec := &specs.Spec{Annotations: ann}
		cfg := config.Default()
		refused := func(err error, annotation string) {
			t.Helper()
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("refusal is not InvalidArgument: %v", err)
			}
			if !strings.Contains(err.Error(), "annotation "+annotation) {
				t.Fatalf("refusal does not name %s: %v", annotation, err)
			}
		}

		vcpus, memoryMiB, err := Size(spec, cfg)
		if err != nil {
			_, v := ann[annotations.VCPUs]
			_, m := ann[annotations.Memory]
			switch {
			case v && strings.Contains(err.Error(), annotations.VCPUs):
				refused(err, annotations.VCPUs)
			case m:
				refused(err, annotations.Memory)
			default:
				t.Fatalf("vmSize refused without a sizing annotation: %v", err)
			}
		} else if vcpus < 1 || vcpus > cfg.MaxVCPUs || memoryMiB < config.MinMemoryMiB || memoryMiB > cfg.MaxMemoryMiB {
			t.Fatalf("vmSize accepted %d vCPUs, %d MiB", vcpus, memoryMiB)
		}
		if err != nil {
			vcpus = cfg.DefaultVCPUs
		}

		cmdline, err := KernelCmdline(spec, cfg)
		if err != nil {
			refused(err, annotations.KernelCmdline)
		} else if len(cmdline) > maxKernelCmdline || strings.ContainsAny(cmdline, "\x00\r\n") {
			t.Fatalf("kernel command line %q accepted", cmdline)
		}

		mode, err := NUMAMode(spec, cfg)
		if err != nil {
			refused(err, annotations.NUMAMode)
			mode = numa.ModeNode
		} else if mode != numa.ModeNode && mode != numa.ModeDedicated && mode != numa.ModeNone {
			t.Fatalf("NUMA mode %q accepted", mode)
		}

		maxVCPUs, err := HotplugMaxVCPUs(spec, cfg, vcpus, mode)
		switch {
		case err != nil:
			refused(err, annotations.MaxVCPUs)
		case maxVCPUs < vcpus || maxVCPUs > cfg.MaxVCPUs:
			t.Fatalf("max vCPUs %d for %d vCPUs accepted", maxVCPUs, vcpus)
		case mode == numa.ModeDedicated && maxVCPUs != vcpus:
			t.Fatalf("dedicated VM of %d vCPUs may grow to %d", vcpus, maxVCPUs)
		}

		sizes, err := DiskImageSizes(spec)
		if err != nil {
			refused(err, annotations.DiskImages)
			return
		}
		for p, size := range sizes {
			if !filepath.IsAbs(p) || filepath.Clean(p) != p || size <= 0 {
				t.Fatalf("disk image %q of %d bytes accepted", p, size)
			}
		}
	})
}
