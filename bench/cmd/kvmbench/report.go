package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Targets from the issue.
const (
	targetStartRatio    = 1.10
	targetDensityGrowth = 1.3
)

// results is everything one run measured; it is written as JSON as is.
type results struct {
	Command  string          `json:"command"`
	Started  time.Time       `json:"started"`
	Finished time.Time       `json:"finished"`
	Machine  facts           `json:"machine"`
	Settings settings        `json:"settings"`
	Latency  *latencyResults `json:"latency,omitempty"`
	Memory   []memoryResult  `json:"memory,omitempty"`
	Density  []densityResult `json:"density,omitempty"`
	Micro    *microResult    `json:"micro,omitempty"`
	Net      *netResults     `json:"net,omitempty"`
	Exec     []execResult    `json:"exec,omitempty"`
	// Resources: VM overhead above guest RAM and live resize (-sections resources).
	Resources *resourcesResults `json:"resources,omitempty"`
	// Volumes: storage in the guest, block volume vs raw libvirt vs virtiofs (-sections volumes).
	Volumes *volumesResults `json:"volumes,omitempty"`
	// Events: the cost of every shim receiving every domain's lifecycle events (-sections events).
	Events []eventsResult `json:"events,omitempty"`
	// Failed lists the sections that failed, with why.
	Failed []string `json:"failed,omitempty"`
	// Disturbance is what else ran on the host during the sections.
	Disturbance *disturbance   `json:"disturbance,omitempty"`
	Derived     map[string]any `json:"derived"`
	Rows        []row          `json:"table"`
	Notes       []string       `json:"notes"`
}

// settings are the knobs of the run.
type settings struct {
	Flavours    []string `json:"flavours"`
	Sections    []string `json:"sections"`
	Runs        int      `json:"latency_runs"`
	Warmup      int      `json:"latency_warmup"`
	MemoryPods  []int    `json:"memory_pods"`
	DensityPods []int    `json:"density_pods"`
	VCPUs       int      `json:"guest_vcpus"`
	MemoryMiB   int      `json:"guest_memory_mib"`
	Image       string   `json:"guest_image"`
	ConfigDrive string   `json:"config_drive"`
	ShimConfig  string   `json:"shim_config"`
}

func settingsOf(c *config) settings {
	return settings{
		Flavours: c.flavours, Sections: c.sections, Runs: c.runs, Warmup: c.warmup,
		MemoryPods: c.memoryPods, DensityPods: c.densityPods, VCPUs: c.vcpus, MemoryMiB: c.memoryMiB,
		Image: "localhost/kvm-guest/kernel:latest (direct kernel boot, busybox initramfs)",
		ConfigDrive: "enabled in both paths: the shim builds a vfat config drive per create (its default); the baseline attaches a copy of the " +
			"same file",
		ShimConfig: shimConfig("<work>/bin", "<daemon dir>", c),
	}
}

// row is one line of the table.
type row struct {
	Section string `json:"section"`
	Measure string `json:"measure"`
	Value   string `json:"value"`
	Target  string `json:"target,omitempty"`
	Status  string `json:"status,omitempty"` // "met", "NOT MET", "info", "not measured"
}

// fail records a section's error, if any.
func (r *results) fail(section string, err error) {
	if err == nil {
		return
	}
	logf("%s: FAILED: %v", section, err)
	r.Failed = append(r.Failed, section+": "+err.Error())
}

func (r *results) add(section, measure, value, target, status string) {
	r.Rows = append(r.Rows, row{section, measure, value, target, status})
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT MET"
}

func msRange(s Summary) string {
	if s.N == 0 {
		return "no successful run"
	}
	return fmt.Sprintf("median %s, p90 %s ms (n=%d)", fmtMs(s.Median), fmtMs(s.P90), s.N)
}

func signedMs(v float64) string {
	if v >= 0 {
		return "+" + fmtMs(v)
	}
	return "-" + fmtMs(-v)
}

func fmtMs(v float64) string {
	if v >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

// build derives the table and the notes from the measurements.
func (r *results) build() {
	r.Derived, r.Rows, r.Notes = map[string]any{}, nil, nil
	r.Notes = append(r.Notes,
		"Acceleration: TCG (software emulation) for every guest. "+r.Machine.AccelWhy+". No KVM figure is estimated.",
		fmt.Sprintf("Guests: %d vCPU, %d MiB, %s (bench-net: %s); kernel command line %s.", r.Settings.VCPUs, r.Settings.MemoryMiB,
			r.Settings.Image, iperfImage, r.Machine.GuestCmdline))
	if d := r.Disturbance; d != nil && d.Samples > 0 {
		r.Notes = append(r.Notes,
			fmt.Sprintf("Other users of the host during the measurements (sampled every second): QEMU processes not started by this run in %d of "+
				"%d samples (at most %d at once); highest 1-minute load %.2f on %d cores, this run's own VMs included.",
				d.SamplesWithOther, d.Samples, d.MaxOtherQEMU, d.MaxLoad1, r.Machine.Cores))
		if d.SamplesWithOther > 0 {
			r.add("-", "host shared during the run",
				fmt.Sprintf("other users' QEMU in %d of %d one-second samples (at most %d at once), load up to %.1f: timings may be disturbed",
					d.SamplesWithOther, d.Samples, d.MaxOtherQEMU, d.MaxLoad1), "quiet host", "NOT MET")
		}
	}
	if r.Machine.OtherQEMU > 0 {
		r.Notes = append(r.Notes,
			fmt.Sprintf("%d QEMU process(es) of other users were running when the run started (load %s): figures may be disturbed.",
				r.Machine.OtherQEMU, r.Machine.LoadAtStart))
	}
	for _, f := range r.Failed {
		r.add("-", "section failed", f, "", "FAILED")
	}
	r.buildLatency()
	r.buildMemory()
	r.buildDensity()
	r.buildNet()
	r.buildExec()
	r.buildResources()
	r.buildVolumes()
	r.buildEvents()
	r.buildMicro()
	r.add("-", "KVM start latency and boot time", "cannot run here: "+r.Machine.AccelWhy, "", "not measured")
	r.add("-", "vhost-net throughput",
		"cannot run here: the shim hands QEMU vhost-net descriptors only for KVM domains, "+
			"and this host has no /dev/vhost-net", "", "not measured")
	if r.Net == nil {
		r.add("-", "network throughput (bench-net)", "not in this run: -sections net", "", "not measured")
	}
}

func (r *results) buildLatency() {
	lat := r.Latency
	if lat == nil {
		return
	}
	var raw *pathResult
	for _, p := range lat.Paths {
		if p.Key == "raw" {
			raw = p
		}
	}
	if raw == nil {
		return
	}
	rawS := summarize(raw.StartMs)
	r.Notes = append(r.Notes,
		"Start latency: the baseline defines and creates, with go-libvirt on one open connection, the inactive domain XML the shim itself "+
			"defined for a `ctr run` VM (renamed, new uuid, fresh console paths, <metadata> removed, kernel/initrd/config drive copied). "+
			"`ctr run -d` is timed from exec until containerd's task API reports RUNNING (ctr exits after task start); CRI from RunPodSandbox "+
			"until ContainerStatus RUNNING (includes CNI and the pod's TAP). "+
			"Paths run interleaved, one of each per iteration, after warm-up runs; every VM is destroyed and checked gone before the next.",
		"Time to userspace: from the same start, polling (10 ms) the console log virtlogd writes for the VM: the guest's first non-blank line "+
			"(the kernel's first message on ttyS0) and KVM-GUEST-READY (its /init is running).")
	for _, p := range lat.Paths {
		s := summarize(p.StartMs)
		sec := "1 start (TCG)"
		switch {
		case p == raw:
			r.add(sec, p.Label, msRange(s), "", "baseline")
		case p.Reference:
			r.Derived["start_ms_"+p.Key] = s.Median
			r.add(sec, p.Label, msRange(s)+"; no VM: containerd's and ctr's own share of a start", "", "reference")
		default:
			ratio := s.Median / rawS.Median
			r.Derived["start_ratio_"+p.Key] = ratio
			r.Derived["start_overhead_ms_"+p.Key] = s.Median - rawS.Median
			r.add(sec, p.Label, fmt.Sprintf("%s; %.2fx baseline, %s ms", msRange(s), ratio, signedMs(s.Median-rawS.Median)),
				fmt.Sprintf("ratio <= %.2f", targetStartRatio), met(ratio <= targetStartRatio && len(p.Failures) == 0))
		}
		if len(p.Failures) > 0 {
			r.add(sec, p.Label+": failed runs", fmt.Sprintf("%d: %s", len(p.Failures), p.Failures[0]), "0", "NOT MET")
		}
	}
	for _, st := range lat.ShimSteps {
		for _, part := range []struct {
			name  string
			steps map[string][]float64
		}{{"Create", st.Create}, {"Start", st.Start}} {
			if len(part.steps["total"]) == 0 {
				continue
			}
			r.Notes = append(r.Notes, fmt.Sprintf("The shim's own time in a VM %s, containerd %s, from its log (median ms over %d VMs): %s.",
				part.name, st.Flavour, len(part.steps["total"]), medianList(part.steps, "total")))
		}
	}
	for _, p := range lat.Paths {
		if p.Reference {
			continue
		}
		first, ready := summarize(p.FirstLineMs), summarize(p.ReadyMs)
		r.add("2 boot (TCG)", p.Label, fmt.Sprintf("first console line %s; userspace ready %s",
			strings.TrimSuffix(msRange(first), fmt.Sprintf(" (n=%d)", first.N)), msRange(ready)), "", "info")
	}
	for _, p := range lat.Paths {
		r.Notes = append(r.Notes, fmt.Sprintf("Phases of %s (median ms): %s.", p.Label, medianList(p.PhasesMs, "")))
	}
	for _, p := range lat.Paths {
		if len(p.PartsMs) == 0 {
			continue
		}
		parts := make([]string, 0, len(startPartNames))
		for _, name := range startPartNames {
			parts = append(parts, fmt.Sprintf("%s %s", name, fmtMs(summarize(p.PartsMs[name]).Median)))
		}
		r.Notes = append(r.Notes,
			fmt.Sprintf("Where the start time of %s goes, from t0 to RUNNING, by the shim's log lines (median ms over %d runs): %s.",
				p.Label, len(p.PartsMs[partCreate]), strings.Join(parts, ", ")))
	}
}

// medianList renders "name median, ..." for every series of m: lead
// first when given, the others by name.
func medianList(m map[string][]float64, lead string) string {
	var keys []string
	for k := range m {
		if k != lead {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	if _, ok := m[lead]; ok && lead != "" {
		keys = append([]string{lead}, keys...)
	}
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %s", k, fmtMs(summarize(m[k]).Median)))
	}
	return strings.Join(parts, ", ")
}

func (r *results) buildMemory() {
	if len(r.Memory) == 0 {
		return
	}
	r.Notes = append(r.Notes,
		"Shim memory: PSS and RSS from /proc/<pid>/smaps_rollup of every containerd-shim-* process started with this containerd's -address, "+
			"summed and divided by the pods, after every guest printed KVM-GUEST-READY and 3 s idle. One shim process per pod on both sides (ours "+
			"serves the sandbox and the VM container; runc's serves the pause sandbox). PSS shares the shim binary's pages among its processes, "+
			"so it falls with more pods. Node cost beside the shim, in the same rounds: RSS and PSS of each VM's QEMU "+
			"(found by its -name guest=<domain>), "+
			"the virtiofsd processes of the pods' shared volumes, and libvirtd's and virtlogd's RSS with the pods running less before the first "+
			"pod, divided by the pods. Anchors from other projects (not measured here): Kata's Go shim about 18 MB PSS per pod; Kuasar's "+
			"sandboxer about 15 MB for 50 pods.")
	find := func(flavour, rt string, n int) *memoryResult {
		for i := range r.Memory {
			m := &r.Memory[i]
			if m.Flavour == flavour && m.Runtime == rt && m.Pods == n {
				return m
			}
		}
		return nil
	}
	for _, m := range r.Memory {
		if m.Runtime != "kvm" {
			continue
		}
		sec := "3 shim memory"
		runc := find(m.Flavour, "runc", m.Pods)
		value := fmt.Sprintf("kvm shim PSS %.1f MiB (anon %.1f, file %.1f), RSS %.1f MiB per pod",
			m.PSSPerPodMiB, m.PSSAnonPerPodMiB, m.PSSFilePerPodMiB, m.RSSPerPodMiB)
		status := "info"
		if runc != nil {
			value += fmt.Sprintf("; runc shim PSS %.1f MiB (anon %.1f, file %.1f), RSS %.1f MiB per pod",
				runc.PSSPerPodMiB, runc.PSSAnonPerPodMiB, runc.PSSFilePerPodMiB, runc.RSSPerPodMiB)
			status = met(m.PSSPerPodMiB <= runc.PSSPerPodMiB)
			r.Derived[fmt.Sprintf("pss_ratio_kvm_to_runc_%s_%d", m.Flavour, m.Pods)] = m.PSSPerPodMiB / runc.PSSPerPodMiB
		}
		r.add(sec, fmt.Sprintf("containerd %s, %d pod(s)", m.Flavour, m.Pods), value, "kvm PSS <= runc PSS", status)
		if m.Node != nil && len(m.Node.QEMURSSKiB) > 0 {
			r.add(sec, fmt.Sprintf("node cost per VM pod beside the shim, containerd %s, %d pod(s)", m.Flavour, m.Pods),
				m.Node.summary(m.Pods), "", "measured")
		}
	}
}

// densityNote explains the density section's figures.
const densityNote = "" +
	"Density: N pods started at once, one goroutine each, through CRI; per pod from its RunPodSandbox until ContainerStatus RUNNING " +
	"(CreateContainer and StartContainer in between), polled every 20 ms. Under TCG the guests that are already booting compete for the 2 " +
	"cores with the pods still starting. Growth = median per-pod time at the largest N / at 1 pod. Control-plane CPU: user+system time " +
	"(from /proc/<pid>/stat, 10 ms ticks) that containerd (with the children it reaped: `shim start` runs, CNI plugins), every shim " +
	"serving it (with its reaped children: mkfs.vfat and mcopy for ours, runc for runc's), libvirtd (with its reaped helpers) and " +
	"virtlogd used from the start of the round until the last pod was RUNNING, divided by the pods; QEMU's own time, which runs the " +
	"guests, is not counted. Its growth is what the control plane costs per pod as pods come together, without the guests' boot competing " +
	"for the cores. A pod count below 10 runs in rounds until 10 pods have started (1 pod: 10 rounds, one after the other): its per-pod " +
	"times are every pod of every round, its CPU per pod and wall time the means over the rounds, since one lone pod's CPU is only a few " +
	"10 ms ticks per process. The same rounds then run with runc pods (a pause container in each, RunPodSandbox to RUNNING the same way) " +
	"as the reference: what containerd, CNI and this 2-core host cost per pod for any runtime. After each round every pod is removed and " +
	"the round checks that no domain, shim process, mount or pod IP is left."

// densityGrowth is the median per-pod time at the most pods over that at
// 1 pod, with those two rounds; ok is false when rounds lacks either.
func densityGrowth(rounds []densityResult) (g float64, one, most densityResult, ok bool) {
	one, most = rounds[0], rounds[len(rounds)-1]
	if one.Pods != 1 || most.Pods <= 1 || one.Summary.N == 0 || most.Summary.N == 0 {
		return 0, one, most, false
	}
	return most.Summary.Median / one.Summary.Median, one, most, true
}

func (r *results) buildDensity() {
	if len(r.Density) == 0 {
		return
	}
	r.Notes = append(r.Notes, densityNote)
	type group struct{ flavour, runtime string }
	byGroup := map[group][]densityResult{}
	var groups []group
	for _, d := range r.Density {
		g := group{d.Flavour, d.Runtime}
		if g.runtime == "" {
			g.runtime = "kvm"
		}
		if _, ok := byGroup[g]; !ok {
			groups = append(groups, g)
		}
		byGroup[g] = append(byGroup[g], d)
	}
	for _, gr := range groups {
		f, rounds := gr.flavour, byGroup[gr]
		sec, label, key := "4 density (TCG)", "containerd "+f, f
		reference := gr.runtime != "kvm"
		if reference {
			label = "reference: " + gr.runtime + " pause pods, containerd " + f
			key = gr.runtime + "_" + f
		}
		// verdict is the target and status of a row: a reference row is
		// measured against nothing.
		verdict := func(target, status string) (string, string) {
			if reference {
				return "", "reference"
			}
			return target, status
		}
		for _, d := range rounds {
			fails := len(d.Failures) + len(d.Leftovers)
			target, status := verdict("0 failures", met(fails == 0))
			what, after := fmt.Sprintf("%s, %d pod(s) at once", label, d.Pods), "all RUNNING after"
			if d.Rounds > 1 {
				what += fmt.Sprintf(", %d rounds", d.Rounds)
				after = "all of a round RUNNING after (mean)"
			}
			r.add(sec, what,
				fmt.Sprintf("per pod %s, max %s ms; %s %s ms; %d failure(s)%s",
					msRange(d.Summary), fmtMs(d.Summary.Max), after, fmtMs(d.WallMs), fails, leftoverNote(d)),
				target, status)
			if d.ControlPlaneTotalMs > 0 {
				r.add(sec, fmt.Sprintf("%s, %d pod(s): control-plane CPU", label, d.Pods),
					fmt.Sprintf("%s ms per pod (%s)", fmtMs(d.ControlPlaneTotalMs), cpuParts(d.ControlPlaneMs)), "", "info")
			}
		}
		g, one, most, ok := densityGrowth(rounds)
		if !ok {
			continue
		}
		r.Derived[fmt.Sprintf("density_growth_%s_1_to_%d", key, most.Pods)] = g
		value := fmt.Sprintf("%.2fx per-pod time (median %s -> %s ms)", g, fmtMs(one.Summary.Median), fmtMs(most.Summary.Median))
		if ref, ok := byGroup[group{f, "runc"}]; ok && !reference {
			if rg, _, _, ok := densityGrowth(ref); ok {
				value += fmt.Sprintf("; runc pause pods in the same containerd: %.2fx", rg)
			}
		}
		target, status := verdict(fmt.Sprintf("<= %.1fx", targetDensityGrowth), met(g <= targetDensityGrowth && len(most.Failures) == 0))
		r.add(sec, fmt.Sprintf("%s, growth 1 -> %d pods", label, most.Pods), value, target, status)
		// The amortised view: wall time of the round per pod, the
		// control plane's cost per pod when pods come in a batch.
		a1, aN := one.WallMs, most.WallMs/float64(most.Pods)
		r.Derived[fmt.Sprintf("density_amortised_growth_%s_1_to_%d", key, most.Pods)] = aN / a1
		r.add(sec, fmt.Sprintf("%s, wall time / pods, 1 -> %d", label, most.Pods),
			fmt.Sprintf("%.2fx (%s -> %s ms per pod)", aN/a1, fmtMs(a1), fmtMs(aN)), "", "info")
		if c1, cN := one.ControlPlaneTotalMs, most.ControlPlaneTotalMs; c1 > 0 && cN > 0 {
			r.Derived[fmt.Sprintf("density_cpu_growth_%s_1_to_%d", key, most.Pods)] = cN / c1
			target, status := verdict(fmt.Sprintf("<= %.1fx", targetDensityGrowth), met(cN/c1 <= targetDensityGrowth && len(most.Failures) == 0))
			r.add(sec, fmt.Sprintf("%s, control-plane CPU per pod, 1 -> %d", label, most.Pods),
				fmt.Sprintf("%.2fx (%s -> %s ms per pod)", cN/c1, fmtMs(c1), fmtMs(cN)), target, status)
		}
	}
}

// cpuParts lists the control plane's CPU per pod by component.
func cpuParts(m map[string]float64) string {
	var parts []string
	for _, k := range []string{cpContainerd, cpShims, cpLibvirtd, cpVirtlogd} {
		parts = append(parts, fmt.Sprintf("%s %s", k, fmtMs(m[k])))
	}
	return strings.Join(parts, ", ")
}

func leftoverNote(d densityResult) string {
	if len(d.Leftovers) == 0 {
		return ""
	}
	return fmt.Sprintf(" (%d left behind)", len(d.Leftovers))
}

func (r *results) buildMicro() {
	m := r.Micro
	if m == nil {
		return
	}
	r.Notes = append(r.Notes, "Micro: `"+m.Command+
		"`; medians over the -count runs; the raw output (benchstat input) is in the JSON and the -micro.txt file. vm.Render is benchmarked "+
		"from bench/micro because vm/ has no benchmark of its own.")
	for _, b := range m.Benchmarks {
		pkg := b.Package[strings.LastIndex(b.Package, "/")+1:]
		value := fmtNs(b.Median["ns/op"]) + "/op"
		if v, ok := b.Median["B/op"]; ok {
			value += fmt.Sprintf(", %.0f B/op, %.0f allocs/op", v, b.Median["allocs/op"])
		}
		r.add("5 micro", pkg+"."+b.Name, value, "", "info")
	}
}

// fmtNs prints nanoseconds with a readable unit: 812 ns, 43.7 µs, 5.61 ms.
func fmtNs(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2f ms", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1f µs", v/1e3)
	}
	return fmt.Sprintf("%.0f ns", v)
}

// header is what precedes the table: where and how it was measured.
func (r *results) header() []string {
	m := r.Machine
	h := []string{
		fmt.Sprintf("machine: %s, %d cores, %d MiB (NUMA node0 %d MiB of %d node(s)), kernel %s", m.CPU, m.Cores, m.MemoryMiB, m.Node0MiB,
			m.NUMANodes, m.Kernel),
		"accel: TCG for every guest (" + m.AccelWhy + ")",
	}
	if len(m.Containerd) > 0 {
		h = append(h,
			fmt.Sprintf("containerd %s; libvirt %s; %s; runc shim: %s", strings.Join(m.Containerd, ", "), m.Libvirt, m.QEMU, m.RuncShim))
	}
	return append(h, fmt.Sprintf("shim %s; guests %d vCPU %d MiB; %s", m.Shim, r.Settings.VCPUs, r.Settings.MemoryMiB, r.Command))
}

var columns = []string{"section", "measure", "value", "target", "status"}

func (r *results) cells() [][]string {
	out := [][]string{}
	for _, x := range r.Rows {
		out = append(out, []string{x.Section, x.Measure, x.Value, x.Target, x.Status})
	}
	return out
}

// table is the plain-text table for stdout.
func (r *results) table() string {
	var b strings.Builder
	for _, h := range r.header() {
		b.WriteString(h + "\n")
	}
	cells := r.cells()
	width := make([]int, len(columns))
	for i, c := range columns {
		width[i] = len(c)
	}
	for _, row := range cells {
		for i, c := range row {
			width[i] = max(width[i], len(c))
		}
	}
	line := func(row []string) {
		for i, c := range row {
			if i == len(row)-1 {
				b.WriteString(c)
			} else {
				b.WriteString(c + strings.Repeat(" ", width[i]-len(c)+2))
			}
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
	line(columns)
	seps := make([]string, len(columns))
	for i := range seps {
		seps[i] = strings.Repeat("-", width[i])
	}
	line(seps)
	for _, row := range cells {
		line(row)
	}
	return b.String()
}

// markdown is the results file for people: facts, the table, the notes.
func (r *results) markdown() string {
	var b strings.Builder
	b.WriteString("# kvmbench results\n\n")
	fmt.Fprintf(&b, "Measured %s to %s. Reproduce with `%s` (as root, after `hack/setup-host.sh`, `hack/guest/build.sh`, `make build`).\n\n",
		r.Started.Format(time.RFC3339), r.Finished.Format(time.RFC3339), r.Command)
	b.WriteString("**Every guest ran under TCG (software emulation), not KVM.** " + r.Machine.AccelWhy + ".\n\n")
	m := r.Machine
	b.WriteString("| machine | |\n|---|---|\n")
	for _, kv := range [][2]string{
		{"CPU", m.CPU}, {"cores", fmt.Sprint(m.Cores)}, {"memory", fmt.Sprintf("%d MiB", m.MemoryMiB)},
		{"NUMA", fmt.Sprintf("%d node(s), node0 %d MiB", m.NUMANodes, m.Node0MiB)},
		{"kernel", m.Kernel}, {"accel", "TCG"}, {"containerd", strings.Join(m.Containerd, ", ")},
		{"libvirt", m.Libvirt}, {"QEMU", m.QEMU}, {"runc", m.Runc}, {"runc shim", m.RuncShim},
		{"kvm shim", m.Shim}, {"revision", m.Revision}, {"Go", m.Go},
		{"load at start", fmt.Sprintf("%s (other QEMU processes: %d)", m.LoadAtStart, m.OtherQEMU)},
	} {
		fmt.Fprintf(&b, "| %s | %s |\n", kv[0], mdEscape(kv[1]))
	}
	b.WriteString("\n| " + strings.Join(columns, " | ") + " |\n|" + strings.Repeat("---|", len(columns)) + "\n")
	for _, row := range r.cells() {
		for i := range row {
			row[i] = mdEscape(row[i])
		}
		b.WriteString("| " + strings.Join(row, " | ") + " |\n")
	}
	b.WriteString("\n## How each number is measured\n\n")
	for _, n := range r.Notes {
		b.WriteString("- " + n + "\n")
	}
	fmt.Fprintf(&b, "\nShim config used (testenv adds `libvirt_uri` and `state_dir`):\n\n```toml\n%s```\n", r.Settings.ShimConfig)
	return b.String()
}

func mdEscape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// write stores <UTC timestamp>-<tag>.json and .md (and -micro.txt) in
// dir, and copies the Markdown to latest<kind>.md: latest.md for runs with
// the main sections, latest-net.md for bench-net alone, latest-exec.md for
// the exec section alone, latest-volumes.md for the volumes section alone,
// latest-events.md for the events section alone, latest-micro.md for the
// micro-benchmarks alone, so that a partial run does not replace the full
// one.
func (r *results) write(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	tag, kind := strings.Join(r.Settings.Flavours, "-"), ""
	switch {
	case r.Latency != nil || r.Memory != nil || r.Density != nil:
	case r.Events != nil && r.Volumes == nil && r.Resources == nil && r.Net == nil && r.Exec == nil && r.Micro == nil:
		tag, kind = tag+"-events", "-events"
	case r.Volumes != nil && r.Resources == nil && r.Net == nil && r.Exec == nil && r.Micro == nil:
		tag, kind = tag+"-volumes", "-volumes"
	case r.Resources != nil && r.Net == nil && r.Micro == nil:
		tag, kind = tag+"-resources", "-resources"
	case r.Net != nil && r.Micro == nil:
		tag, kind = tag+"-net", "-net"
	case r.Exec != nil && r.Micro == nil:
		tag, kind = tag+"-exec", "-exec"
	case r.Net == nil && r.Micro != nil:
		tag, kind = "micro", "-micro"
	}
	base := filepath.Join(dir, r.Started.Format("20060102T150405Z")+"-"+tag)
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, err
	}
	md := r.markdown()
	files := map[string][]byte{base + ".json": append(js, '\n'), base + ".md": []byte(md), filepath.Join(dir, "latest"+kind+".md"): []byte(md)}
	if r.Micro != nil {
		files[base+"-micro.txt"] = []byte(r.Micro.Output)
	}
	var paths []string
	for p, b := range files {
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return nil, err
		}
		paths = append(paths, p)
	}
	slices.Sort(paths)
	return paths, nil
}

func (r *results) buildNet() {
	n := r.Net
	if n == nil {
		return
	}
	r.Notes = append(r.Notes,
		fmt.Sprintf("bench-net: TCP throughput with iperf3 between the guest (server, started from its console shell) and the host (client), "+
			"%d s per direction with the first second omitted, same guest (localhost/kvm-guest/iperf:latest: the test guest plus the host's "+
			"iperf3 in a second initramfs archive) and the same shim-rendered domain XML. "+
			"(a) and (b): `ctr run` in a netns whose only interface is eth0 of a veth pair (host end %s), so the shim wires its TAP to eth0 with "+
			"tc; (d): the same with the pod shaped as Calico shapes it (/32, on-link route to 169.254.1.1, default route via it, proxy ARP and a "+
			"/32 route on the host end), the bridge shape being (a); (c): the shim's inactive XML of an (a) VM, renamed, ip= pointed at a host "+
			"bridge, plus <interface type='bridge'> (a TAP libvirt creates on the bridge), defined with go-libvirt. "+
			"Ratios are per iteration (the variants run interleaved), given as the median and the range over the runs. Under TCG the guest's "+
			"single emulated vCPU is the bottleneck, so absolute numbers are low.", n.Seconds, podGateway))
	var a, b, c, cal *netVariant
	for _, v := range n.Variants {
		switch v.Key {
		case "a":
			a = v
		case "b":
			b = v
		case "c":
			c = v
		case "d":
			cal = v
		}
		status := "info"
		if len(v.Failures) > 0 {
			status = fmt.Sprintf("%d failed", len(v.Failures))
		}
		var offloads []string
		for _, f := range uniq(v.Features) {
			offloads = append(offloads, virtioOffloads(f))
		}
		r.add("net (TCG)", v.Label, fmt.Sprintf("host->guest %s; guest->host %s; offloads the guest negotiated: %s",
			mbps(v.RxMbps), mbps(v.TxMbps), strings.Join(offloads, " / ")), "", status)
	}
	ratio := func(name string, x, y *netVariant, target float64) {
		for _, dir := range []struct {
			label string
			xs    []float64
			ys    []float64
		}{{"host->guest", x.RxMbps, y.RxMbps}, {"guest->host", x.TxMbps, y.TxMbps}} {
			var rs []float64
			for i := 0; i < min(len(dir.xs), len(dir.ys)); i++ {
				if dir.ys[i] > 0 {
					rs = append(rs, dir.xs[i]/dir.ys[i])
				}
			}
			if len(rs) == 0 {
				r.add("net (TCG)", name+" "+dir.label, "no paired runs", fmt.Sprintf(">= %.2f", target), "NOT MET")
				continue
			}
			s := summarize(rs)
			r.Derived["net_ratio_"+strings.ReplaceAll(name, "/", "_")+"_"+strings.ReplaceAll(dir.label, "->", "_to_")] = s.Median
			r.add("net (TCG)", name+" "+dir.label, fmt.Sprintf("%.2f (%.2f-%.2f over %d runs)", s.Median, s.Min, s.Max, s.N),
				fmt.Sprintf(">= %.2f", target), met(s.Median >= target))
		}
	}
	if a != nil && b != nil {
		ratio("a/b", a, b, 2.0)
	}
	if a != nil && c != nil {
		ratio("a/c", a, c, 0.95)
	}
	if cal != nil && a != nil {
		ratio("d/a", cal, a, 0.95) // Calico shape / bridge shape
	}
}

func mbps(v []float64) string {
	if len(v) == 0 {
		return "no run"
	}
	s := summarize(v)
	return fmt.Sprintf("median %.0f Mbit/s (%.0f-%.0f, n=%d)", s.Median, s.Min, s.Max, s.N)
}

func uniq(v []string) []string {
	var out []string
	for _, x := range v {
		if x != "" && !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	if len(out) == 0 {
		return []string{"(not reported)"}
	}
	return out
}

// rerender reads a results JSON written by an earlier run, rebuilds its
// table and notes with this version of the report, prints the table and
// rewrites the Markdown beside it.
func rerender(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var r results
	if err = json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	r.build()
	fmt.Print(r.table())
	js, err := json.MarshalIndent(&r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(js, '\n'), 0o644); err != nil {
		return err
	}
	md := strings.TrimSuffix(path, ".json") + ".md"
	logf("rewrote %s and %s", path, md)
	return os.WriteFile(md, []byte(r.markdown()), 0o644)
}

// virtioOffloads names the offload bits set in a virtio-net feature string
// as Linux prints it in /sys/class/net/<if>/device/features (bit 0 first).
func virtioOffloads(bits string) string {
	names := map[int]string{0: "CSUM", 1: "GUEST_CSUM", 7: "GUEST_TSO4", 8: "GUEST_TSO6", 9: "GUEST_ECN",
		10: "GUEST_UFO", 11: "HOST_TSO4", 12: "HOST_TSO6", 13: "HOST_ECN", 14: "HOST_UFO"}
	var set []string
	for i := 0; i < len(bits) && i <= 14; i++ {
		if bits[i] == '1' && names[i] != "" {
			set = append(set, names[i])
		}
	}
	if strings.Trim(bits, "01") != "" || bits == "" {
		return bits
	}
	if len(set) == 0 {
		return "none"
	}
	return strings.Join(set, " ")
}
