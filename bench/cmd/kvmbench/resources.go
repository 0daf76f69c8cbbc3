package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
	"github.com/kvm-shim/containerd-shim-kvm-v1/cgroup"
	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// The "resources" section (-sections resources): what a VM costs its pod
// above guest RAM, and how fast a live resize reaches the guest.
//
// Overhead: a VM of each size boots a guest that fills all but 24 MiB of
// its available memory (kvmguest.fill: every page of guest RAM touched),
// in a pod cgroup as kubelet makes it. Then QEMU's smaps give its resident
// memory and the part of it that is guest RAM, and the container's cgroup
// gives what the pod is charged for (QEMU, its page tables and kernel
// memory). The overhead is what the pod needs above guest RAM.
//
// Resize: a 1-vCPU, 256 MiB VM that may grow to 2 vCPUs and 512 MiB is
// resized through CRI UpdateContainerResources from 1 to 2 vCPUs (a QEMU
// hot-plug), then from 256 to 512 MiB (virtio-mem) and back, then from 2
// to 1 vCPU (the guest agent takes CPU 1 offline) and to 2 again (it
// onlines it), runs times, each on a new VM (so that every 1 -> 2 is a
// plug); each time is from the call until the guest reports its CPUs or
// MemTotal (KVM-GUEST-CPUS and KVM-GUEST-MEMTOTAL on its console).

// overheadSizes are the VM sizes measured: MiB of guest RAM and vCPUs.
var overheadSizes = []struct{ memMiB, vcpus int }{{512, 1}, {2048, 2}}

type overheadResult struct {
	Flavour   string `json:"flavour"`
	MemoryMiB int    `json:"memory_mib"`
	VCPUs     int    `json:"vcpus"`
	FilledMiB int    `json:"guest_filled_mib"` // what the guest wrote into its tmpfs
	// From QEMU's /proc/<pid>/smaps: resident (Rss), proportional (Pss),
	// and the resident part of the guest RAM mapping.
	QEMURSSMiB     float64 `json:"qemu_rss_mib"`
	QEMUPSSMiB     float64 `json:"qemu_pss_mib"`
	GuestRAMRSSMiB float64 `json:"guest_ram_rss_mib"`
	// QEMUOverheadMiB = QEMURSSMiB - GuestRAMRSSMiB: QEMU's own memory.
	QEMUOverheadMiB float64 `json:"qemu_overhead_mib"`
	// From the container's cgroup: the charge now and its peak.
	CgroupUsageMiB float64 `json:"cgroup_usage_mib"`
	CgroupPeakMiB  float64 `json:"cgroup_peak_mib"`
	// PodOverheadMiB = CgroupPeakMiB - GuestRAMRSSMiB: what the pod's
	// memory limit must hold above the guest RAM the guest touched (a
	// guest rarely touches every page: the kernel keeps some unused).
	PodOverheadMiB float64 `json:"pod_overhead_mib"`
}

type resizeResult struct {
	Flavour string  `json:"flavour"`
	Grow    Summary `json:"grow_1_to_2"` // UpdateContainerResources to the guest seeing CPU 1 online
	// UpdateContainerResources to the guest seeing CPU 1 offline (its
	// agent took it offline), and online again.
	Shrink Summary `json:"shrink_2_to_1"`
	Online Summary `json:"online_1_to_2"`
	// UpdateContainerResources to the guest's MemTotal growing by 256
	// MiB, and back to what it booted with.
	MemoryGrow   Summary `json:"memory_256_to_512"`
	MemoryShrink Summary `json:"memory_512_to_256"`
}

type resourcesResults struct {
	Overhead []overheadResult `json:"overhead"`
	Resize   []resizeResult   `json:"resize"`
	// PodFixedMiB is the RuntimeClass overhead.podFixed memory the
	// measurements call for: the largest PodOverheadMiB plus a quarter,
	// rounded up to 16 MiB.
	PodFixedMiB int `json:"pod_fixed_mib"`
}

func runResources(ctx context.Context, e *env) (*resourcesResults, error) {
	h, err := cgroup.Detect()
	if err != nil {
		return nil, err
	}
	out := &resourcesResults{}
	for _, d := range e.daemons {
		logf("resources: containerd %s, live resize 1 <-> 2 vCPUs and 256 <-> 512 MiB, %d runs each way", d.name(), e.cfg.runs)
		r, err := measureResize(ctx, d, h, e.cfg.runs)
		if err != nil {
			return out, fmt.Errorf("containerd %s, resize: %w", d.name(), err)
		}
		out.Resize = append(out.Resize, r)
		for _, sz := range overheadSizes {
			logf("resources: containerd %s, overhead of a %d MiB / %d vCPU VM", d.name(), sz.memMiB, sz.vcpus)
			r, err := measureOverhead(ctx, d, h, sz.memMiB, sz.vcpus)
			if err != nil {
				return out, fmt.Errorf("containerd %s, %d MiB VM: %w", d.name(), sz.memMiB, err)
			}
			logf("resources: QEMU RSS %.0f MiB of which guest RAM %.0f; QEMU overhead %.1f MiB; cgroup peak %.0f MiB, %.1f MiB above guest RAM",
				r.QEMURSSMiB, r.GuestRAMRSSMiB, r.QEMUOverheadMiB, r.CgroupPeakMiB, r.PodOverheadMiB)
			out.Overhead = append(out.Overhead, r)
		}
	}
	return out, nil
}

// podEnv is what running a VM pod takes: the daemon, a CRI client of
// it, and the host's cgroups.
type podEnv struct {
	d  *daemon
	cl *testenv.CRI
	h  cgroup.Hierarchies
}

// vmPodRun is a running VM pod: its container, the container's CRI log,
// the container's cgroup, and stop, which removes the pod and its parent.
type vmPodRun struct {
	cid, logPath string
	g            *cgroup.Group
	stop         func() error
}

// vmPod runs a pod in its own cgroup parent with one VM container and
// waits for the guest to be up.
func vmPod(ctx context.Context, pe podEnv, name string, o testenv.ContainerOptions) (vmPodRun, error) {
	d, cl, h := pe.d, pe.cl, pe.h
	parent := fmt.Sprintf("/kvmbench/pod-%s-%d", name, time.Now().UnixNano())
	p, err := cl.RunPod(ctx, testenv.PodOptions{Name: name, Namespace: "kvmbench", Handler: "kvm", CgroupParent: parent})
	if err != nil {
		return vmPodRun{}, err
	}
	run := vmPodRun{stop: func() error {
		errs := []error{cl.RemovePod(ctx, p.ID)}
		if left := d.WaitNothingLeft(ctx, goneTimeout); len(left) > 0 {
			errs = append(errs, fmt.Errorf("left behind: %s", strings.Join(left, "; ")))
		}
		if pg, groupErr := h.Group(parent); groupErr == nil {
			errs = append(errs, pg.Remove())
		}
		return errors.Join(errs...)
	}}
	fail := func(err error) (vmPodRun, error) {
		return vmPodRun{}, errors.Join(err, run.stop())
	}
	o.Name, o.Image = "vm", d.kernelRef
	if run.cid, err = cl.CreateContainer(ctx, p, o); err != nil {
		return fail(err)
	}
	if err = cl.StartContainer(ctx, run.cid); err != nil {
		return fail(err)
	}
	if run.g, err = h.Group(parent + "/" + run.cid); err != nil {
		return fail(err)
	}
	run.logPath = p.LogPath("vm")
	if _, err = waitConsole(ctx, run.logPath, readyLine, bootTimeout); err != nil {
		return fail(err)
	}
	return run, nil
}

// waitConsole waits for a line containing prefix in the VM's CRI log and
// returns the rest of the last such line.
func waitConsole(ctx context.Context, path, prefix string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var v string
	err := testenv.Poll(ctx, 20*time.Millisecond, func() (bool, string) {
		v = lastConsoleValue(path, prefix)
		return v != "", "no " + prefix + " in " + path
	})
	return v, err
}

func lastConsoleValue(path, prefix string) string {
	b, _ := os.ReadFile(path)
	v := ""
	for _, l := range strings.Split(string(b), "\n") {
		if i := strings.Index(l, prefix); i >= 0 {
			v = strings.TrimSpace(l[i+len(prefix):])
			if v == "" {
				v = prefix
			}
		}
	}
	return v
}

func measureOverhead(ctx context.Context, d *daemon, h cgroup.Hierarchies, memMiB, vcpus int) (res overheadResult, retErr error) {
	res = overheadResult{Flavour: d.name(), MemoryMiB: memMiB, VCPUs: vcpus}
	cl, err := d.DialCRI()
	if err != nil {
		return res, err
	}
	defer cl.Close()
	pod, err := vmPod(ctx, podEnv{d: d, cl: cl, h: h}, fmt.Sprintf("overhead-%d", memMiB), testenv.ContainerOptions{
		MemoryLimit: int64(memMiB) << 20,
		Annotations: map[string]string{annotations.VCPUs: strconv.Itoa(vcpus),
			annotations.KernelCmdline: "console=ttyS0 quiet kvmguest.fill"},
	})
	if err != nil {
		return res, err
	}
	logPath, g := pod.logPath, pod.g
	defer func() { retErr = errors.Join(retErr, pod.stop()) }()
	// Under TCG the guest writes some 10-20 MiB/s into its tmpfs.
	filled, err := waitConsole(ctx, logPath, "KVM-GUEST-FILLED ", bootTimeout+time.Duration(memMiB/4)*time.Second)
	if err != nil {
		b, _ := os.ReadFile(logPath)
		return res, fmt.Errorf("%w; console tail:\n%s", err, testenv.Tail(string(b), 15))
	}
	res.FilledMiB, _ = strconv.Atoi(filled)
	select {
	case <-ctx.Done():
		return res, ctx.Err()
	case <-time.After(settle):
	}
	procs, err := g.Procs()
	if err != nil || len(procs) != 1 {
		return res, fmt.Errorf("the VM's cgroup %s holds %v (%v), want QEMU alone", g.Path, procs, err)
	}
	rss, pss, guest, err := qemuMemory(procs[0], memMiB)
	if err != nil {
		return res, err
	}
	st, err := g.Stats()
	if err != nil {
		return res, err
	}
	const kib, b = 1024.0, 1 << 20
	res.QEMURSSMiB, res.QEMUPSSMiB, res.GuestRAMRSSMiB = float64(rss)/kib, float64(pss)/kib, float64(guest)/kib
	res.QEMUOverheadMiB = res.QEMURSSMiB - res.GuestRAMRSSMiB
	res.CgroupUsageMiB, res.CgroupPeakMiB = float64(st.MemoryUsage)/b, float64(st.MemoryMaxUsage)/b
	if st.MemoryMaxUsage == 0 { // cgroup v2 without memory.peak
		res.CgroupPeakMiB = res.CgroupUsageMiB
	}
	return res, nil
}

// qemuMemory reads QEMU's smaps: total Rss and Pss, and the Rss of the
// guest RAM mapping (the anonymous mapping of guest RAM's size, plus
// QEMU's alignment slack), all in KiB.
func qemuMemory(pid, memMiB int) (rss, pss, guest int, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return 0, 0, 0, err
	}
	defer f.Close()
	rss, pss, guest, err = parseSmaps(f, memMiB)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("QEMU pid %d: %w", pid, err)
	}
	return rss, pss, guest, nil
}

func parseSmaps(r io.Reader, memMiB int) (rss, pss, guest int, err error) {
	lo, hi := memMiB*1024, memMiB*1024+8*1024
	var size int
	anon, found := false, false
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		if !strings.HasSuffix(fields[0], ":") {
			anon, size = len(fields) < 6, 0 // a mapping's header: a path is the sixth field
			continue
		}
		if len(fields) != 3 || fields[2] != "kB" {
			continue
		}
		n, _ := strconv.Atoi(fields[1])
		switch fields[0] {
		case "Size:":
			size = n
		case "Rss:":
			rss += n
			if anon && size >= lo && size <= hi && n > guest {
				guest, found = n, true
			}
		case "Pss:":
			pss += n
		}
	}
	if err := sc.Err(); err != nil {
		return 0, 0, 0, err
	}
	if !found {
		return 0, 0, 0, fmt.Errorf("no anonymous mapping of %d MiB (the guest RAM)", memMiB)
	}
	return rss, pss, guest, nil
}

func measureResize(ctx context.Context, d *daemon, h cgroup.Hierarchies, runs int) (res resizeResult, retErr error) {
	res = resizeResult{Flavour: d.name()}
	cl, err := d.DialCRI()
	if err != nil {
		return res, err
	}
	defer cl.Close()
	var s resizeSamples
	var cid, logPath string
	stop := func() error { return nil }
	defer func() { retErr = errors.Join(retErr, stop()) }()
	for i := 0; i < runs; i++ {
		if cid == "" { // a fresh 1-vCPU VM
			pod, err := vmPod(ctx, podEnv{d: d, cl: cl, h: h}, fmt.Sprintf("resize-%d", i), testenv.ContainerOptions{
				MemoryLimit: resizeMemLimit, CPUs: 1, Annotations: map[string]string{annotations.MaxVCPUs: "2",
					annotations.MaxMemoryMiB: "512"},
			})
			if err != nil {
				return res, err
			}
			cid, logPath, stop = pod.cid, pod.logPath, pod.stop
			if _, err := waitCPUs(ctx, logPath, "0", bootTimeout); err != nil {
				return res, err
			}
		}
		update := func(cpus, mem int64) error {
			_, err := cl.Runtime.UpdateContainerResources(ctx, &cri.UpdateContainerResourcesRequest{
				ContainerId: cid,
				Linux:       &cri.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: cpus * 100000, MemoryLimitInBytes: mem},
			})
			return err
		}
		if err := s.measure(ctx, update, logPath); err != nil {
			return res, err
		}
		// The next run's 1 -> 2 is a plug again: a new VM.
		if err := stop(); err != nil {
			return res, err
		}
		cid, stop = "", func() error { return nil }
	}
	res.Grow, res.MemoryGrow, res.MemoryShrink = summarize(s.grow), summarize(s.memGrow), summarize(s.memShrink)
	res.Shrink, res.Online = summarize(s.shrink), summarize(s.online)
	return res, nil
}

// resizeMemLimit is the resize benchmark's VM's memory limit at boot.
const resizeMemLimit = 256 << 20

// resizeSamples are the resize benchmark's times, in ms, of each step.
type resizeSamples struct {
	grow, memGrow, memShrink, shrink, online []float64
}

// measure times one run's steps on a fresh 1-vCPU VM whose console log
// is logPath: 1 -> 2 CPUs, memory up and down, 2 -> 1 and 1 -> 2 CPUs;
// update sets the container's CPUs and memory limit.
func (s *resizeSamples) measure(ctx context.Context, update func(cpus, mem int64) error, logPath string) error {
	const memLimit = resizeMemLimit
	start := time.Now()
	if err := update(2, memLimit); err != nil {
		return fmt.Errorf("UpdateContainerResources to 2 CPUs: %w", err)
	}
	if _, err := waitCPUs(ctx, logPath, "0-1", time.Minute); err != nil {
		return err
	}
	s.grow = append(s.grow, float64(time.Since(start).Microseconds())/1000)
	bootKB, err := strconv.Atoi(lastConsoleValue(logPath, "KVM-GUEST-MEMTOTAL "))
	if err != nil {
		return fmt.Errorf("guest MemTotal: %w", err)
	}
	for _, step := range []struct {
		mem  int64
		kB   int
		into *[]float64
	}{{2 * memLimit, bootKB + memLimit>>10, &s.memGrow}, {memLimit, bootKB, &s.memShrink}} {
		start := time.Now()
		if err := update(2, step.mem); err != nil {
			return fmt.Errorf("UpdateContainerResources to %d MiB: %w", step.mem>>20, err)
		}
		if _, err := waitConsoleValue(ctx, logPath, "KVM-GUEST-MEMTOTAL ", strconv.Itoa(step.kB), time.Minute); err != nil {
			return err
		}
		*step.into = append(*step.into, float64(time.Since(start).Microseconds())/1000)
	}
	for _, step := range []struct {
		cpus   int64
		online string
		into   *[]float64
	}{{1, "0", &s.shrink}, {2, "0-1", &s.online}} {
		start := time.Now()
		if err := update(step.cpus, memLimit); err != nil {
			return fmt.Errorf("UpdateContainerResources to %d CPUs: %w", step.cpus, err)
		}
		if _, err := waitCPUs(ctx, logPath, step.online, time.Minute); err != nil {
			return err
		}
		*step.into = append(*step.into, float64(time.Since(start).Microseconds())/1000)
	}
	return nil
}

// waitCPUs waits until the guest's last KVM-GUEST-CPUS line is want.
func waitCPUs(ctx context.Context, logPath, want string, timeout time.Duration) (string, error) {
	return waitConsoleValue(ctx, logPath, "KVM-GUEST-CPUS ", want, timeout)
}

// waitConsoleValue waits until the guest's last "<prefix>" line is want.
func waitConsoleValue(ctx context.Context, logPath, prefix, want string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var got string
	err := testenv.Poll(ctx, 10*time.Millisecond, func() (bool, string) {
		got = lastConsoleValue(logPath, prefix)
		return got == want, "guest " + prefix + got + ", want " + want
	})
	return got, err
}

// derive computes the overheads from the measurements (so -rerender of
// an earlier run applies the same formula).
func (x *resourcesResults) derive() {
	x.PodFixedMiB = 0
	for i := range x.Overhead {
		o := &x.Overhead[i]
		o.PodOverheadMiB = o.CgroupPeakMiB - o.GuestRAMRSSMiB
		x.PodFixedMiB = max(x.PodFixedMiB, int(math.Ceil(o.PodOverheadMiB*1.25/16))*16)
	}
}

func (r *results) buildResources() {
	x := r.Resources
	if x == nil {
		return
	}
	x.derive()
	for _, o := range x.Overhead {
		r.add("resources",
			fmt.Sprintf("memory above guest RAM, %d MiB / %d vCPU VM, all guest RAM touched (%s, TCG)", o.MemoryMiB, o.VCPUs, o.Flavour),
			fmt.Sprintf("pod cgroup peak %.0f MiB = guest RAM touched %.0f + %.1f MiB; QEMU RSS %.0f MiB (guest RAM %.0f + QEMU's own %.1f), PSS "+
				"%.0f MiB",
				o.CgroupPeakMiB, o.GuestRAMRSSMiB, o.PodOverheadMiB, o.QEMURSSMiB, o.GuestRAMRSSMiB, o.QEMUOverheadMiB, o.QEMUPSSMiB), "", "measured")
	}
	if len(x.Overhead) > 0 {
		r.add("resources", "RuntimeClass overhead.podFixed memory (largest overhead + 25%, to 16 MiB)", fmt.Sprintf("%d Mi", x.PodFixedMiB), "",
			"derived")
	}
	for _, z := range x.Resize {
		r.add("resources", fmt.Sprintf("UpdateContainerResources to the guest seeing its CPUs (%s, TCG)", z.Flavour),
			"1 -> 2 vCPUs: "+msRange(z.Grow), "", "measured")
		if z.Shrink.N > 0 {
			r.add("resources",
				fmt.Sprintf("UpdateContainerResources to the guest taking a vCPU offline and online again, guest agent (%s, TCG)", z.Flavour),
				"2 -> 1 vCPUs: "+msRange(z.Shrink)+"; 1 -> 2 vCPUs: "+msRange(z.Online), "", "measured")
		}
		if z.MemoryGrow.N > 0 {
			r.add("resources", fmt.Sprintf("UpdateContainerResources to the guest seeing its memory, virtio-mem (%s, TCG)", z.Flavour),
				"256 -> 512 MiB: "+msRange(z.MemoryGrow)+"; 512 -> 256 MiB: "+msRange(z.MemoryShrink), "", "measured")
		}
	}
}
