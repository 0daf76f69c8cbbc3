package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"
)

// A CRI log of a guest that ran the storage benchmark: CRI's prefix on
// every line, the kernel's and /init's other lines around.
const ioLog = `2026-11-23T22:30:00.1Z stdout F KVM-GUEST-READY
2026-11-23T22:30:00.2Z stdout F KVM-GUEST-DISK dev-xvda /dev/vdb ro=0 data=
2026-11-23T22:30:00.3Z stdout F KVM-GUEST-IO start disk:dev-xvda mode=direct mib=16 ops=400 runs=2
2026-11-23T22:30:01.0Z stdout F KVM-GUEST-IO run 1 seqwrite 40.50 seqread 80.00 randwrite 900.5 randread 1200.0
2026-11-23T22:30:02.0Z stdout F KVM-GUEST-IO run 2 seqwrite 42.50 seqread 84.00 randwrite 950.0 randread 1300.0
2026-11-23T22:30:02.1Z stdout F KVM-GUEST-IO done
`

func TestParseIO(t *testing.T) {
	target, mode, runs, done, err := parseIO(ioLog)
	if err != nil || !done || target != "disk:dev-xvda" || mode != "direct" || len(runs) != 2 {
		t.Fatalf("parseIO: target %q, mode %q, %d runs, done %v, %v", target, mode, len(runs), done, err)
	}
	if runs[1] != (ioSample{42.5, 84, 950, 1300}) {
		t.Errorf("run 2: %+v", runs[1])
	}
	// Not finished yet: no error, not done.
	if _, _, runs, done, err := parseIO(ioLog[:strings.Index(ioLog, "2026-11-23T22:30:02.0Z")]); err != nil || done || len(runs) != 1 {
		t.Errorf("half a log: %d runs, done %v, %v", len(runs), done, err)
	}
	for name, bad := range map[string]string{
		"fail": "KVM-GUEST-IO start dir:/shared mode=cached mib=16 ops=400 runs=1\r\nKVM-GUEST-IO-FAIL sequential write: no space left on " +
			"device\r\n",
		"short":     "KVM-GUEST-IO run 1 seqwrite 1 seqread 2\n",
		"not a num": "KVM-GUEST-IO run 1 seqwrite x seqread 2 randwrite 3 randread 4\n",
		"zero":      "KVM-GUEST-IO run 1 seqwrite 0 seqread 2 randwrite 3 randread 4\n",
	} {
		if _, _, _, _, err := parseIO(bad); err == nil {
			t.Errorf("%s: parseIO accepted %q", name, bad)
		}
	}
	if _, _, _, _, err := parseIO("KVM-GUEST-IO-FAIL no disk with serial dev-xvda\n"); err == nil ||
		!strings.Contains(err.Error(), "no disk with serial dev-xvda") {
		t.Errorf("the guest's reason is lost: %v", err)
	}
}

func TestIOVariantAddOutput(t *testing.T) {
	v := &ioVariant{Key: "a"}
	if err := v.addOutput(ioLog, "dir:/shared", 2, 0); err == nil {
		t.Error("another target's figures were taken (a stale log of another VM)")
	}
	if err := v.addOutput(ioLog, "disk:dev-xvda", 3, 0); err == nil {
		t.Error("2 runs were taken where 3 were asked for")
	}
	if err := v.addOutput(strings.Replace(ioLog, "KVM-GUEST-IO done", "", 1), "disk:dev-xvda", 2, 0); err == nil {
		t.Error("a guest that did not finish was taken")
	}
	if err := v.addOutput(ioLog, "disk:dev-xvda", 2, 0); err != nil || len(v.SeqReadMiBs) != 2 || v.Mode != "direct" {
		t.Errorf("addOutput: %v, %+v", err, v)
	}
}

func TestIOVariantModes(t *testing.T) {
	v := &ioVariant{Key: "c"}
	if err := v.add("cached", []ioSample{{1, 2, 3, 4}}, 0); err != nil {
		t.Fatal(err)
	}
	if err := v.add("direct", []ioSample{{1, 2, 3, 4}}, 1); err == nil {
		t.Error("a VM that did direct I/O was mixed with cached ones")
	}
	if len(v.SeqWriteMiBs) != 1 || v.RandReadIOPS[0] != 4 {
		t.Errorf("samples: %+v", v)
	}
}

const shimVolumeXML = `<domain type='qemu' id='3'>
  <name>kvm-kvmbench-vm-1</name>
  <memory unit='KiB'>131072</memory>
  <vcpu placement='static' cpuset='0-1' current='1'>4</vcpu>
  <os>
    <type arch='x86_64' machine='pc-q35-7.2'>hvm</type>
    <kernel>/run/b/shim-state/vms/abc/vmlinuz</kernel>
    <initrd>/run/b/shim-state/vms/abc/initrd.img</initrd>
    <cmdline>console=ttyS0 quiet</cmdline>
  </os>
  <devices>
    <emulator>/run/b/bin/kvm-qemu-wrapper</emulator>
  </devices>
</domain>`

func TestRawVolumeDomain(t *testing.T) {
	vm, err := parseShimDomain(shimVolumeXML)
	if err != nil {
		t.Fatal(err)
	}
	want := rawVolumeVM{Type: "qemu", Arch: "x86_64", Machine: "pc-q35-7.2", Emulator: "/run/b/bin/kvm-qemu-wrapper",
		Kernel: "/run/b/shim-state/vms/abc/vmlinuz", Initrd: "/run/b/shim-state/vms/abc/initrd.img", MemoryKiB: 131072, VCPUs: 1}
	if *vm != want {
		t.Errorf("parseShimDomain = %+v, want %+v", *vm, want)
	}
	if _, err = parseShimDomain(`<domain type='qemu'><memory unit='KiB'>1</memory><vcpu>1</vcpu></domain>`); err == nil {
		t.Error("a domain without a kernel was taken")
	}

	out, err := vm.domainXML("kvmbench-vol-1-0", "6f1c2a4e-8d3b-4e7f-9a0b-1c2d3e4f5a6b", "/dev/loop3", "/run/x/console.log",
		"console=ttyS0 kvm-guest.iobench=disk:dev-xvda,16,400,3 <&>")
	if err != nil {
		t.Fatal(err)
	}
	var back libvirtxml.Domain
	if err = back.Unmarshal(string(out)); err != nil {
		t.Fatal(err)
	}
	disk := back.Devices.Disks[0]
	if disk.Source.Block == nil || disk.Driver.Cache != "none" || disk.Driver.IO != "native" ||
		disk.Source.Block.Dev != "/dev/loop3" || disk.Serial != volumeSerial || back.Memory.Value != 131072 || back.VCPU.Value != 1 ||
		back.OS.Cmdline != "console=ttyS0 kvm-guest.iobench=disk:dev-xvda,16,400,3 <&>" {
		t.Errorf("raw domain XML:\n%s", out)
	}
	validator, err := exec.LookPath("virt-xml-validate")
	if err != nil {
		t.Skip("virt-xml-validate not installed (package libvirt-clients)")
	}
	if _, err := exec.LookPath("xmllint"); err != nil {
		t.Skip("xmllint, which virt-xml-validate runs, not installed (package libxml2-utils)")
	}
	f := filepath.Join(t.TempDir(), "raw.xml")
	if err := os.WriteFile(f, out, 0o644); err != nil {
		t.Fatal(err)
	}
	if msg, err := exec.Command(validator, f, "domain").CombinedOutput(); err != nil {
		t.Errorf("the raw domain does not validate: %v\n%s\n%s", err, msg, out)
	}
}

func TestRoundRatios(t *testing.T) {
	// Round 0: medians 20 / 10; round 1: 30 / 40; round 2 only in x.
	got := roundRatios([]float64{10, 20, 30, 30, 99}, []int{0, 0, 0, 1, 2}, []float64{10, 40}, []int{0, 1})
	if !slices.Equal(got, []float64{2, 0.75}) {
		t.Errorf("roundRatios = %v, want [2 0.75]", got)
	}
	// Results written before rounds were recorded: one round.
	if got := roundRatios([]float64{1, 3}, nil, []float64{4}, nil); !slices.Equal(got, []float64{0.5}) {
		t.Errorf("without rounds: %v", got)
	}
}

func TestBuildVolumes(t *testing.T) {
	r := &results{Volumes: &volumesResults{Flavour: "1.6", MiB: 16, Ops: 400, VMs: 3, InnerRuns: 3, Variants: []*ioVariant{
		{Key: "a", Label: "(a) shim", Mode: "direct", SeqWriteMiBs: []float64{40, 50, 60}, SeqReadMiBs: []float64{100, 100, 100},
			RandWriteIOPS: []float64{900, 900, 900}, RandReadIOPS: []float64{1000, 1000, 1000}, Rounds: []int{0, 0, 1},
			CPUSeconds: []float64{22, 30}, CPURounds: []int{0, 1}},
		{Key: "b", Label: "(b) raw", Mode: "direct", SeqWriteMiBs: []float64{50, 50}, SeqReadMiBs: []float64{100, 100},
			RandWriteIOPS: []float64{1000, 1000}, RandReadIOPS: []float64{1000, 1000}, Rounds: []int{0, 1},
			CPUSeconds: []float64{20, 20}, CPURounds: []int{0, 1}},
		{Key: "c", Label: "(c) virtiofs", Mode: "cached", SeqWriteMiBs: []float64{25}, SeqReadMiBs: []float64{50}, RandWriteIOPS: []float64{300},
			RandReadIOPS: []float64{500}, Rounds: []int{0},
			Failures: []string{"round 1: boom"}},
	}}}
	r.build()
	rows := map[string]row{}
	for _, x := range r.Rows {
		rows[x.Measure] = x
	}
	ab := rows["a/b: shim block volume / raw libvirt domain"]
	// rand write 900/1000 = 0.90 misses 0.95: NOT MET.
	if ab.Status != "NOT MET" || !strings.Contains(ab.Value, "seq write 1.05 (0.90-1.20)") ||
		!strings.Contains(ab.Value, "rand write 0.90 (0.90-0.90)") {
		t.Errorf("a/b row: %+v", ab)
	}
	ca := rows["c/a: virtiofs share / shim block volume"]
	if ca.Status != "info" || !strings.Contains(ca.Value, "seq write 0.56 (0.56-0.56)") || !strings.Contains(ca.Value, "rand read 0.50") {
		t.Errorf("c/a row: %+v", ca)
	}
	if a := rows["(a) shim"]; !strings.Contains(a.Value, "seq write 50.0 (40.0-60.0, n=3) MiB/s") || a.Status != "measured" {
		t.Errorf("(a) row: %+v", a)
	}
	if c := rows["(c) virtiofs"]; c.Status != "1 failed" || !strings.Contains(c.Value, "I/O cached") {
		t.Errorf("(c) row: %+v", c)
	}
	// CPU per round: 22/20 and 30/20.
	if cpu := rows["a/b: QEMU CPU seconds for the same runs"]; !strings.HasPrefix(cpu.Value, "1.30 (1.10-1.50)") || cpu.Status != "info" {
		t.Errorf("a/b CPU row: %+v", cpu)
	}
	if a := rows["(a) shim"]; !strings.Contains(a.Value, "QEMU CPU for a VM's runs 26.0 (22.0-30.0, n=2) s") {
		t.Errorf("(a) row lacks its CPU: %+v", a)
	}
	if got := r.Derived["volumes_ratio_a_b_rand_write"]; got != 0.9 {
		t.Errorf("derived a/b rand write = %v", got)
	}
	md := r.markdown()
	if !strings.Contains(md, "hack/guest/iobench") || !strings.Contains(md, "| volumes (TCG) |") {
		t.Errorf("markdown lacks the volumes rows or note:\n%s", md)
	}
}

func TestRoundOrderAlternates(t *testing.T) {
	vs := []*ioVariant{{Key: "a"}, {Key: "b"}, {Key: "c"}}
	keys := func(vs []*ioVariant) (s string) {
		for _, v := range vs {
			s += v.Key
		}
		return s
	}
	for i, want := range []string{"abc", "cba", "abc", "cba"} {
		if got := keys(roundOrder(vs, i)); got != want {
			t.Errorf("round %d: %s, want %s", i, got, want)
		}
	}
	if keys(vs) != "abc" {
		t.Errorf("roundOrder changed its argument: %s", keys(vs))
	}
}
