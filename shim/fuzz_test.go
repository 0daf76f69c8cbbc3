package shim

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
	"github.com/kvm-shim/containerd-shim-kvm-v1/config"
	"github.com/kvm-shim/containerd-shim-kvm-v1/numa"
)

// FuzzPodAnnotations drives every kvm.containerd.io/ annotation the shim
// package reads (vcpus, memory, kernel-cmdline, numa-mode, max-vcpus,
// disk-images; the config drive's are fuzzed in configdrive) through the
// same functions Create uses. Run it with
//
//	go test -run='^$' -fuzz=FuzzPodAnnotations -fuzztime=30s ./shim/
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

		vcpus, memoryMiB, err := vmSize(spec, cfg)
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

		cmdline, err := kernelCmdline(spec, cfg)
		if err != nil {
			refused(err, annotations.KernelCmdline)
		} else if len(cmdline) > maxKernelCmdline || strings.ContainsAny(cmdline, "\x00\r\n") {
			t.Fatalf("kernel command line %q accepted", cmdline)
		}

		mode, err := numaMode(spec, cfg)
		if err != nil {
			refused(err, annotations.NUMAMode)
			mode = numa.ModeNode
		} else if mode != numa.ModeNode && mode != numa.ModeDedicated && mode != numa.ModeNone {
			t.Fatalf("NUMA mode %q accepted", mode)
		}

		maxVCPUs, err := hotplugMaxVCPUs(spec, cfg, vcpus, mode)
		switch {
		case err != nil:
			refused(err, annotations.MaxVCPUs)
		case maxVCPUs < vcpus || maxVCPUs > cfg.MaxVCPUs:
			t.Fatalf("max vCPUs %d for %d vCPUs accepted", maxVCPUs, vcpus)
		case mode == numa.ModeDedicated && maxVCPUs != vcpus:
			t.Fatalf("dedicated VM of %d vCPUs may grow to %d", vcpus, maxVCPUs)
		}

		sizes, err := diskImageSizes(spec)
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

// FuzzReadRecord feeds arbitrary bytes to the task record reader, which
// the cleanup `delete` of a dead shim trusts to find what to undo. Run it
// with
//
//	go test -run='^$' -fuzz=FuzzReadRecord -fuzztime=30s ./shim/
//
// Properties: no panic; an unreadable record is an error naming the file;
// a record that reads is written back and reads again to the same record
// (nothing the reader accepts is lost or changed by the writer).
// The seed corpus is below and in testdata/fuzz/FuzzReadRecord.
func FuzzReadRecord(f *testing.F) {
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"kind":"vm","id":"c1","namespace":"k8s.io","stateDir":"/var/lib/x","libvirtSocket":"/run/libvirt/libvirt-sock","pid":42,` +
		`"domain":"kvm-k8s.io-c1-0123","vmDir":"/var/lib/x/vms/kvm-k8s.io-c1-0123",` +
		`"overlay":"/var/lib/x/pods/u/overlay.qcow2","keepOverlay":true,` +
		`"numaOwner":"kvm-k8s.io-c1-0123","numaStore":"/run/x/numa.json",` +
		`"network":{"netns":"/var/run/netns/cni-1","links":[{"podIf":"eth0","tap":"tap0","createdQdisc":true}]},` +
		`"cgroup":"/kubepods/pod1/c1","cgroupCreated":true,"podUID":"u"}`))
	f.Add([]byte(`{"kind":"sandbox","id":"sb","podNetwork":{},"network":{"netns":"/n","podIf":"eth0","tap":"t","createdQdisc":true}}`))
	f.Add([]byte(`{"kind":"vm","id":"\u0000","pid":-1,"network":null}`))
	f.Add([]byte(`{"kind":1}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"id":"a","id":"b"}`))
	f.Add([]byte("\xff\xfe{"))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, recordFile), data, 0o600); err != nil {
			t.Fatal(err)
		}
		r, err := readRecord(dir)
		if err != nil {
			if !strings.Contains(err.Error(), filepath.Join(dir, recordFile)) {
				t.Fatalf("error does not name the record: %v", err)
			}
			return
		}
		if r == nil {
			t.Fatal("an existing record read as none")
		}
		if err = writeRecord(dir, r); err != nil {
			t.Fatalf("write back: %v", err)
		}
		back, err := readRecord(dir)
		if err != nil {
			t.Fatalf("read back: %v", err)
		}
		if !reflect.DeepEqual(r, back) {
			t.Fatalf("record changed by a write and read:\n%#v\n%#v", r, back)
		}
	})
}
