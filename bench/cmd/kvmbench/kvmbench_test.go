package main

import (
	"bufio"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestSummarize(t *testing.T) {
	s := summarize([]float64{10, 1, 9, 2, 8, 3, 7, 4, 6, 5})
	if s.N != 10 || s.Min != 1 || s.Max != 10 || s.Median != 5.5 || s.Mean != 5.5 {
		t.Errorf("summary = %+v", s)
	}
	// Type 7: h = 0.9*9 = 8.1, between the 9th (9) and 10th (10).
	if math.Abs(s.P90-9.1) > 1e-9 {
		t.Errorf("p90 = %v, want 9.1", s.P90)
	}
	if one := summarize([]float64{42}); one.Median != 42 || one.P90 != 42 {
		t.Errorf("one sample: %+v", one)
	}
	if empty := summarize(nil); empty.N != 0 {
		t.Errorf("no samples: %+v", empty)
	}
}

func TestHasLine(t *testing.T) {
	for in, want := range map[string]bool{
		"":                        false,
		"Linux version 6.1":       false, // not complete yet
		"\r\n  \n":                false,
		"\nLinux version 6.1\r\n": true,
		"\x1b[2J\x1b[H\nabc\n":    true,
	} {
		if got := hasLine([]byte(in)); got != want {
			t.Errorf("hasLine(%q) = %v, want %v", in, got, want)
		}
	}
}

const shimXML = `<domain type='qemu'>
  <name>kvm-default-lat-template-74de1d145fa7</name>
  <uuid>6f1c2a4e-8d3b-5e7f-9a0b-1c2d3e4f5a6b</uuid>
  <metadata>
    <kvm:vm xmlns:kvm="https://github.com/kvm-shim/containerd-shim-kvm-v1/metadata/v1">
      <kvm:container-id>lat-template</kvm:container-id>
    </kvm:vm>
  </metadata>
  <memory unit='KiB'>131072</memory>
  <os>
    <kernel>/run/b/shim-state/vms/abc/vmlinuz</kernel>
    <initrd>/run/b/shim-state/vms/abc/initrd</initrd>
  </os>
  <devices>
    <disk type='file' device='disk'>
      <source file='/run/b/shim-state/vms/abc/config-2.img'/>
    </disk>
    <serial type='unix'>
      <source mode='bind' path='/run/b/shim-state/vms/abc/console.sock'/>
      <log file='/run/b/shim-state/vms/abc/console.log' append='on'/>
    </serial>
  </devices>
</domain>`

func TestBaselineXML(t *testing.T) {
	dom, vmDir, err := shimDomain(shimXML)
	if err != nil || vmDir != "/run/b/shim-state/vms/abc" {
		t.Fatalf("console log dir %q: %v", vmDir, err)
	}
	tmpl, err := baselineTemplate(dom, vmDir, "/run/b/raw/files", "/run/b/shim-state")
	if err != nil {
		t.Fatal(err)
	}
	x, err := tmpl.instance("kvmbench-raw-1-0", "6f1c2a4e-8d3b-4e7f-9a0b-1c2d3e4f5a6c", "/run/b/raw/run-0")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"<name>kvmbench-raw-1-0</name>", "<uuid>6f1c2a4e-8d3b-4e7f-9a0b-1c2d3e4f5a6c</uuid>",
		"<kernel>/run/b/raw/files/vmlinuz</kernel>", "<initrd>/run/b/raw/files/initrd</initrd>",
		`file="/run/b/raw/files/config-2.img"`, `path="/run/b/raw/run-0/console.sock"`, `file="/run/b/raw/run-0/console.log"`,
		`<memory unit="KiB">131072</memory>`,
	} {
		if !strings.Contains(x, want) {
			t.Errorf("baseline XML lacks %s:\n%s", want, x)
		}
	}
	if strings.Contains(x, "metadata") || strings.Contains(x, "shim-state") {
		t.Errorf("baseline XML keeps the shim's metadata or state dir:\n%s", x)
	}
	// A second run gets its own identity and console from the same template.
	y, err := tmpl.instance("kvmbench-raw-1-1", "6f1c2a4e-8d3b-4e7f-9a0b-1c2d3e4f5a6d", "/run/b/raw/run-1")
	if err != nil || !strings.Contains(y, "<name>kvmbench-raw-1-1</name>") || !strings.Contains(y, `file="/run/b/raw/run-1/console.log"`) {
		t.Errorf("second instance (%v):\n%s", err, y)
	}
	overlay := strings.Replace(shimXML, "/run/b/shim-state/vms/abc/config-2.img", "/run/b/shim-state/pods/u/vm/overlay.qcow2", 1)
	if dom, vmDir, err = shimDomain(overlay); err != nil {
		t.Fatal(err)
	}
	if _, err := baselineTemplate(dom, vmDir, "/run/b/raw/files", "/run/b/shim-state"); err == nil {
		t.Error("a disk outside the VM dir must be refused")
	}
	if _, _, err := shimDomain(`<domain type='qemu'><devices></devices></domain>`); err == nil {
		t.Error("a domain without a console log was taken")
	}
}

func TestParseBench(t *testing.T) {
	out := `goos: linux
goarch: amd64
pkg: example.com/m/configdrive
cpu: AMD EPYC
BenchmarkBuildVFAT-2   	     100	   5000000 ns/op	   57931 B/op	     508 allocs/op
BenchmarkBuildVFAT-2   	     100	   7000000 ns/op	   57931 B/op	     508 allocs/op
BenchmarkBuildVFAT-2   	     100	   6000000 ns/op	   57931 B/op	     508 allocs/op
BenchmarkReserve8Nodes/fs=tmpfs-2 	 1000	 83100 ns/op
PASS
ok  	example.com/m/configdrive	3.1s
PASS
ok  	example.com/m/vm	0.01s
`
	got, empty := parseBench(out)
	if len(got) != 2 {
		t.Fatalf("got %+v", got)
	}
	if b := got[0]; b.Name != "BenchmarkBuildVFAT" || b.Runs != 3 || b.Median["ns/op"] != 6e6 || b.Median["allocs/op"] != 508 {
		t.Errorf("first = %+v", b)
	}
	if b := got[1]; b.Name != "BenchmarkReserve8Nodes/fs=tmpfs" || b.Package != "example.com/m/configdrive" {
		t.Errorf("second = %+v", b)
	}
	if len(empty) != 1 || empty[0] != "example.com/m/vm" {
		t.Errorf("packages without benchmarks = %v", empty)
	}
}

func TestParseSmapsRollup(t *testing.T) {
	in := `55c0a0000000-7ffd4b1fe000 ---p 00000000 00:00 0                          [rollup]
Rss:               15772 kB
Pss:               10240 kB
Pss_Anon:           6000 kB
Pss_File:           4240 kB
Pss_Shmem:             0 kB
`
	m, err := parseSmapsRollup(bufio.NewScanner(strings.NewReader(in)))
	if err != nil {
		t.Fatal(err)
	}
	if m["Rss"] != 15772 || m["Pss"] != 10240 || m["Pss_Anon"] != 6000 || m["Pss_File"] != 4240 {
		t.Errorf("got %v", m)
	}
	if _, err := parseSmapsRollup(bufio.NewScanner(strings.NewReader("Rss: 1 kB\n"))); err == nil {
		t.Error("no Pss must be an error")
	}
}

func TestParseFlags(t *testing.T) {
	c, err := parseFlags([]string{"-quick", "-runs", "5"})
	if err != nil {
		t.Fatal(err)
	}
	if c.runs != 5 || c.microCount != 1 || len(c.densityPods) != 2 || c.densityPods[1] != 4 {
		t.Errorf("-quick with -runs 5: %+v", c)
	}
	if _, err := parseFlags([]string{"-sections", "latency,bogus"}); err == nil {
		t.Error("an unknown section must be an error")
	}
	if _, err := parseFlags([]string{"-density-pods", "1,0"}); err == nil {
		t.Error("a zero pod count must be an error")
	}
}

func TestTableAndMarkdown(t *testing.T) {
	r := &results{Command: "go run ./bench/cmd/kvmbench", Machine: facts{CPU: "X", Cores: 2, AccelWhy: "no KVM"}}
	r.Latency = &latencyResults{Paths: []*pathResult{
		{Key: "raw", Label: "baseline", StartMs: []float64{100, 110}, FirstLineMs: []float64{1}, ReadyMs: []float64{2}},
		{Key: "ctr-1.6", Label: "ctr", Flavour: "1.6", StartMs: []float64{105, 115}, FirstLineMs: []float64{1}, ReadyMs: []float64{2}},
	}}
	r.Memory = []memoryResult{
		{Flavour: "1.6", Runtime: "kvm", Pods: 2, PSSPerPodMiB: 9, Node: &nodeCost{
			QEMURSSKiB: []int{150 << 10, 160 << 10}, QEMUPSSKiB: []int{140 << 10, 150 << 10},
			DaemonGrowthKiB: map[string]int{"libvirtd": 1 << 10, "virtlogd": 512}}},
		{Flavour: "1.6", Runtime: "runc", Pods: 2, PSSPerPodMiB: 10},
	}
	r.Density = []densityResult{
		{Flavour: "1.6", Pods: 1, Summary: summarize([]float64{500}), WallMs: 500},
		{Flavour: "1.6", Pods: 20, Summary: summarize([]float64{600, 700}), WallMs: 4000},
	}
	r.build()
	tab := r.table()
	for _, want := range []string{"TCG", "1.05x baseline, +5.0 ms", "ratio <= 1.10", "kvm PSS <= runc PSS", "1.30x per-pod time",
		"not measured",
		"QEMU RSS median 160.0 MiB (max 160.0), PSS median 150.0 MiB; libvirtd +0.50 MiB, virtlogd +0.25 MiB per pod; no virtiofsd"} {
		if !strings.Contains(tab, want) {
			t.Errorf("table lacks %q:\n%s", want, tab)
		}
	}
	if strings.Count(tab, "NOT MET") != 0 {
		t.Errorf("every target is met in this input:\n%s", tab)
	}
	md := r.markdown()
	if !strings.Contains(md, "| section | measure | value | target | status |") || !strings.Contains(md, "TCG") {
		t.Errorf("markdown:\n%s", md)
	}
}

func TestVirtioOffloads(t *testing.T) {
	on := "1110010111111111111101010000110010000000100000000000000000000000"
	off := "0010010000000001111101010000110010000000100000000000000000000000"
	if got := virtioOffloads(on); got != "CSUM GUEST_CSUM GUEST_TSO4 GUEST_TSO6 GUEST_ECN GUEST_UFO HOST_TSO4 HOST_TSO6 HOST_ECN HOST_UFO" {
		t.Errorf("with vnet_hdr: %q", got)
	}
	if got := virtioOffloads(off); got != "none" {
		t.Errorf("without vnet_hdr: %q", got)
	}
	if got := virtioOffloads("(x)"); got != "(x)" {
		t.Errorf("not a bit string: %q", got)
	}
}

func TestStatCPUTicks(t *testing.T) {
	// A command name with a space and a parenthesis, as a process may
	// choose; utime 7, stime 5, cutime 100, cstime 20.
	stat := "1234 (odd) name) S 1 1234 1234 0 -1 4194560 500 0 0 0 7 5 100 20 20 0 3 0 100 1000 200"
	for _, tc := range []struct {
		children bool
		want     int64
	}{{false, 12}, {true, 132}} {
		got, err := statCPUTicks(stat, tc.children)
		if err != nil || got != tc.want {
			t.Errorf("children=%v: %d, %v; want %d", tc.children, got, err, tc.want)
		}
	}
	if _, err := statCPUTicks("1234 (short) S 1 2", false); err == nil {
		t.Error("short stat: no error")
	}
}

func TestShimStepTimes(t *testing.T) {
	log := `time="x" level=info msg="defined VM" accel=tcg took="checks=0.0ms rootfs=0.5ms total=12.5ms" vm=a
time="x" level=info msg="started VM" pid=7 took="libvirt_create=430.1ms resume=3.2ms total=433.3ms" vm=a
time="x" level=info msg="other" took="total=99ms"
time="x" level=info msg="defined VM" took="checks=0.1ms rootfs=0.7ms total=14.5ms" vm=b`
	st := shimStepTimes("1.6", log)
	if got := st.Create["total"]; len(got) != 2 || got[0] != 12.5 || got[1] != 14.5 {
		t.Errorf("create totals %v", got)
	}
	if got := st.Start["libvirt_create"]; len(got) != 1 || got[0] != 430.1 {
		t.Errorf("start libvirt_create %v", got)
	}
	if len(st.Start["total"]) != 1 {
		t.Errorf("start totals %v (the unrelated line must not count)", st.Start["total"])
	}
}

func TestStartParts(t *testing.T) {
	dir := t.TempDir()
	logPath := filepath.Join(dir, "containerd.log")
	earlier := `time="2026-11-22T13:00:00.000000000Z" level=info msg="defined VM" took="define=1.0ms total=9.0ms" vm=old
time="2026-11-22T13:00:00.500000000Z" level=info msg="started VM" took="libvirt_create=400.0ms total=410.0ms" vm=old
`
	//nolint:lll // containerd's log lines as it writes them
	run := `time="2026-11-22T13:16:01.650000000Z" level=debug msg="starting signal loop"
time="2026-11-22T13:16:01.695000000Z" level=info msg="defined VM" accel=tcg took="checks=0.0ms define=6.5ms total=17.0ms" vcpus=1 vm=kvm-default-lat-2
time="2026-11-22T13:16:02.184000000Z" level=info msg="started VM" pid=13968 took="libvirt_create=476.0ms resume=6.0ms total=482.0ms" vm=kvm-default-lat-2
`
	if err := os.WriteFile(logPath, []byte(earlier), 0o644); err != nil {
		t.Fatal(err)
	}
	offset := logSize(logPath)
	f, err := os.OpenFile(logPath, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err = f.WriteString(run); err != nil {
		t.Fatal(err)
	}
	f.Close()

	t0 := time.Date(2026, 11, 22, 13, 16, 1, 600_000_000, time.UTC)
	running := time.Date(2026, 11, 22, 13, 16, 2, 190_000_000, time.UTC)
	parts, err := startParts(logPath, offset, t0, running)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]time.Duration{
		partToCreate:  78 * time.Millisecond, // 01.695 - 17 ms - 01.600
		partCreate:    17 * time.Millisecond,
		partToStart:   7 * time.Millisecond, // 02.184 - 482 ms - 01.695
		partStart:     482 * time.Millisecond,
		partToRunning: 6 * time.Millisecond,
	}
	for k, w := range want {
		if d := parts[k] - w; d > time.Microsecond || d < -time.Microsecond {
			t.Errorf("%s = %v, want %v", k, parts[k], w)
		}
	}
	// From the start of the log, the earlier run's lines make it ambiguous.
	if _, err := startParts(logPath, 0, t0, running); err == nil || !strings.Contains(err.Error(), "more than one") {
		t.Errorf("two runs' lines: err = %v", err)
	}
	// A run that started no VM logged neither line.
	if _, err := startParts(logPath, logSize(logPath), t0, running); err == nil {
		t.Error("no lines: want an error")
	}
}

func TestDensityRounds(t *testing.T) {
	for n, want := range map[int]int{1: 10, 3: 4, 4: 3, 10: 1, 20: 1} {
		if got := densityRepeats(n); got != want {
			t.Errorf("densityRepeats(%d) = %d, want %d", n, got, want)
		}
	}
	m := mergeRounds([]densityResult{
		{Flavour: "1.6", Runtime: "kvm", Pods: 1, PerPodMs: []float64{500}, WallMs: 500,
			ControlPlaneMs: map[string]float64{cpShims: 20, cpLibvirtd: 80}, ControlPlaneTotalMs: 100},
		{Flavour: "1.6", Runtime: "kvm", Pods: 1, PerPodMs: []float64{700}, WallMs: 700,
			ControlPlaneMs: map[string]float64{cpShims: 40, cpLibvirtd: 100}, ControlPlaneTotalMs: 140, Failures: []string{"x"}},
	})
	if m.Rounds != 2 || m.Pods != 1 || m.Flavour != "1.6" || m.Runtime != "kvm" {
		t.Errorf("merged identity %+v", m)
	}
	if len(m.PerPodMs) != 2 || m.Summary.N != 2 || m.Summary.Median != 600 {
		t.Errorf("merged per-pod %v, summary %+v", m.PerPodMs, m.Summary)
	}
	if m.WallMs != 600 || m.ControlPlaneTotalMs != 120 || m.ControlPlaneMs[cpShims] != 30 || m.ControlPlaneMs[cpLibvirtd] != 90 {
		t.Errorf("merged means: wall %v, cpu %v %v", m.WallMs, m.ControlPlaneTotalMs, m.ControlPlaneMs)
	}
	if len(m.Failures) != 1 {
		t.Errorf("merged failures %v", m.Failures)
	}
}

func TestExecRows(t *testing.T) {
	r := &results{Settings: settings{Flavours: []string{"1.6"}}, Started: time.Date(2026, 11, 23, 20, 0, 0, 0, time.UTC)}
	r.Exec = []execResult{
		{Flavour: "1.6", Runs: 3, LatencyMs: []float64{50, 60, 70}, P50Ms: 60, P99Ms: 69.8, ShimCPUPerExecMs: 1.25, AgentReadyMs: 5000},
		{Flavour: "2.x", Runs: 3, LatencyMs: []float64{50, 60}, Failures: []string{"exit code 126"}, P50Ms: 55, P99Ms: 59.9,
			ShimCPUPerExecMs: 1.5},
	}
	r.build()
	tab := r.table()
	for _, want := range []string{"exec (TCG) 1.6", "p50 60.0 ms, p99 69.8 ms (n=3, 0 failed)", "1.2 ms (user+system", "exec (TCG) 2.x"} {
		if !strings.Contains(tab, want) {
			t.Errorf("table lacks %q:\n%s", want, tab)
		}
	}
	if n := strings.Count(tab, "NOT MET"); n != 1 {
		t.Errorf("%d NOT MET rows, want the one with a failure:\n%s", n, tab)
	}
	dir := t.TempDir()
	paths, err := r.write(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(paths, filepath.Join(dir, "latest-exec.md")) {
		t.Errorf("an exec-only run wrote %v, want latest-exec.md and not latest.md", paths)
	}
}
