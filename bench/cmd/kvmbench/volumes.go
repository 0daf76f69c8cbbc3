package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/digitalocean/go-libvirt"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
	"github.com/kvm-shim/containerd-shim-kvm-v1/cgroup"
	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// The "volumes" section (-sections volumes): storage throughput measured
// in the guest (hack/guest/iobench, run by /init when the kernel command
// line has kvm-guest.iobench=) on
//
//	(a) a raw block volume (a loop device on a file) given to a VM pod
//	    through CRI and the shim;
//	(b) the same loop device given by hand to a raw libvirt domain
//	    (go-libvirt define + create, <disk type='block'> cache=none
//	    io=native) with the same kernel, initrd, memory and vCPUs;
//	(c) a virtiofs share of a host directory through CRI, the same
//	    workload on a file in it.
//
// The variants run interleaved, one VM of each per round; each VM runs the
// workload volumeInnerRuns times. Containerd flavour: the first one.

// volumeInnerRuns is how many times each VM runs the workload.
const volumeInnerRuns = 3

// volumeCmdline starts every variant's kernel command line. The guests of
// all three run the same processes: no QEMU guest agent, since (b) has no
// agent channel. With the agent running in (a)'s guest alone, a/b read
// 0.84-0.97 and 0.58-0.89 in two runs (0.93-1.03 without): on the one
// emulated vCPU, guest processes compete with the benchmark.
const volumeCmdline = "console=ttyS0 quiet kvm-guest.agent=off "

// volumeSerial is the block volume's serial in both (a) and (b): the shim
// names a raw block volume after its container path, /dev/xvda.
const (
	volumeDevicePath = "/dev/xvda"
	volumeSerial     = "dev-xvda"
	volumeSharePath  = "/shared"
	ioTimeout        = 5 * time.Minute
)

// ioVariant is one way of giving the guest its storage, every sample of
// every VM of that way.
type ioVariant struct {
	Key   string `json:"key"`
	Label string `json:"label"`
	// Mode is how the guest did its I/O: "direct" (O_DIRECT) or
	// "cached" (the target refused O_DIRECT: page cache, sync after
	// writes, caches dropped before reads).
	Mode          string    `json:"mode"`
	SeqWriteMiBs  []float64 `json:"seq_write_mib_s"`
	SeqReadMiBs   []float64 `json:"seq_read_mib_s"`
	RandWriteIOPS []float64 `json:"rand_write_iops"`
	RandReadIOPS  []float64 `json:"rand_read_iops"`
	// Rounds holds the round of each sample: ratios pair the VMs of one
	// round, which ran back to back.
	Rounds []int `json:"rounds"`
	// CPUSeconds is, per VM, the CPU time its QEMU's cgroup used from
	// the guest's "start" line to its "done" (the workload's runs, not
	// the boot), with CPURounds its round: the host CPU the same work
	// cost, which other users loading the cores barely change.
	CPUSeconds []float64 `json:"qemu_cpu_s,omitempty"`
	CPURounds  []int     `json:"qemu_cpu_rounds,omitempty"`
	Failures   []string  `json:"failures,omitempty"`
}

type volumesResults struct {
	Flavour   string       `json:"flavour"`
	MiB       int          `json:"mib"`        // sequential bytes per run and the random I/O's span
	Ops       int          `json:"random_ops"` // 4 KiB operations per random run
	VMs       int          `json:"vms"`        // VMs per variant
	InnerRuns int          `json:"runs_per_vm"`
	Loop      string       `json:"loop_io"` // the loop device's I/O to its file: direct or buffered
	Variants  []*ioVariant `json:"variants"`
}

// ioSample is one run's figures as the guest printed them.
type ioSample struct{ seqWrite, seqRead, randWrite, randRead float64 }

// parseIO reads the guest's KVM-GUEST-IO lines from console output (a CRI
// log or a plain console log): the target and mode, every run's figures,
// and whether it is done. A KVM-GUEST-IO-FAIL line is an error.
func parseIO(out string) (target, mode string, runs []ioSample, done bool, err error) {
	for _, l := range strings.Split(out, "\n") {
		if i := strings.Index(l, "KVM-GUEST-IO-FAIL"); i >= 0 {
			return target, mode, runs, false, fmt.Errorf("the guest's benchmark failed: %s", strings.TrimSpace(l[i:]))
		}
		i := strings.Index(l, "KVM-GUEST-IO ")
		if i < 0 {
			continue
		}
		f := strings.Fields(l[i+len("KVM-GUEST-IO "):])
		switch {
		case len(f) == 0:
		case f[0] == "start" && len(f) > 1:
			target = f[1]
			for _, kv := range f[2:] {
				if v, ok := strings.CutPrefix(kv, "mode="); ok {
					mode = v
				}
			}
		case f[0] == "run":
			if len(f) != 10 || f[2] != "seqwrite" || f[4] != "seqread" || f[6] != "randwrite" || f[8] != "randread" {
				return target, mode, runs, false, fmt.Errorf("malformed line %q", strings.TrimSpace(l[i:]))
			}
			var v [4]float64
			for k, s := range []string{f[3], f[5], f[7], f[9]} {
				if v[k], err = strconv.ParseFloat(s, 64); err != nil || v[k] <= 0 {
					return target, mode, runs, false, fmt.Errorf("malformed figure %q in %q", s, strings.TrimSpace(l[i:]))
				}
			}
			runs = append(runs, ioSample{v[0], v[1], v[2], v[3]})
		case f[0] == "done":
			done = true
		}
	}
	return target, mode, runs, done, nil
}

// addOutput records the runs of one VM's console output, which must be
// for target and complete.
func (v *ioVariant) addOutput(out, target string, want, round int) error {
	got, mode, runs, done, err := parseIO(out)
	switch {
	case err != nil:
		return err
	case got != target:
		return fmt.Errorf("the guest measured %q, want %q", got, target)
	case !done || len(runs) != want:
		return fmt.Errorf("the guest reported %d runs (done: %v), want %d", len(runs), done, want)
	}
	return v.add(mode, runs, round)
}

// add records one VM's runs.
func (v *ioVariant) add(mode string, runs []ioSample, round int) error {
	if v.Mode != "" && v.Mode != mode {
		return fmt.Errorf("%s: the guest used %s I/O, earlier VMs %s", v.Key, mode, v.Mode)
	}
	v.Mode = mode
	for _, r := range runs {
		v.SeqWriteMiBs = append(v.SeqWriteMiBs, r.seqWrite)
		v.SeqReadMiBs = append(v.SeqReadMiBs, r.seqRead)
		v.RandWriteIOPS = append(v.RandWriteIOPS, r.randWrite)
		v.RandReadIOPS = append(v.RandReadIOPS, r.randRead)
		v.Rounds = append(v.Rounds, round)
	}
	return nil
}

// iobenchArg is the guest's kvm-guest.iobench= value for a target.
func (x *volumesResults) iobenchArg(target string) string {
	return fmt.Sprintf("kvm-guest.iobench=%s,%d,%d,%d", target, x.MiB, x.Ops, x.InnerRuns)
}

func runVolumes(ctx context.Context, e *env) (_ *volumesResults, retErr error) {
	d := e.daemons[0]
	res := &volumesResults{Flavour: d.name(), MiB: e.cfg.volumeMiB, Ops: e.cfg.volumeOps, VMs: e.cfg.volumeVMs, InnerRuns: volumeInnerRuns,
		Loop: e.cfg.volumeLoop}
	h, err := cgroup.Detect()
	if err != nil {
		return nil, err
	}
	// The volume's file and the share live on a disk file system, as a
	// PV would (the work dir is on tmpfs).
	dir, err := os.MkdirTemp("/var/tmp", "kvmbench-volumes-")
	if err != nil {
		return nil, err
	}
	defer func() { retErr = errors.Join(retErr, os.RemoveAll(dir)) }()
	blockFile, share, err := writeVolumeFiles(dir, int64(res.MiB)<<20)
	if err != nil {
		return nil, err
	}
	// Direct I/O by default: a PVC's block device has no host page cache
	// under cache=none. A buffered loop device charges the page cache of
	// the guest's writes to the cgroup of whoever writes: the pod's
	// memory-limited one for (a), an unlimited one for (b).
	dio := "--direct-io=on"
	if res.Loop == "buffered" {
		dio = "--direct-io=off"
	}
	loop, detach, err := testenv.AttachLoopFile(ctx, blockFile, dio)
	if err != nil {
		return nil, err
	}
	defer func() { retErr = errors.Join(retErr, detach()) }()
	l, err := testenv.ConnectLibvirt()
	if err != nil {
		return nil, err
	}
	defer l.Disconnect()

	a := &ioVariant{Key: "a", Label: "(a) raw block volume (loop device) through CRI and the shim"}
	b := &ioVariant{Key: "b", Label: "(b) the same loop device in a raw libvirt domain (go-libvirt; <disk type='block'> cache=none io=native)"}
	c := &ioVariant{Key: "c", Label: "(c) virtiofs share of a host directory through CRI and the shim, a file in it"}
	res.Variants = []*ioVariant{a, b, c}
	vb := &volBench{d: d, e: e, h: h, l: l, loop: loop, share: share, res: res}
	for i := 0; i < res.VMs && ctx.Err() == nil; i++ {
		logf("volumes: round %d/%d (%d MiB, %d random 4 KiB ops, %d runs per VM)", i+1, res.VMs, res.MiB, res.Ops, res.InnerRuns)
		for _, v := range roundOrder(res.Variants, i) {
			if err := vb.runVariant(ctx, v, i); err != nil {
				logf("volumes: %s round %d failed: %v", v.Key, i, err)
				v.Failures = append(v.Failures, fmt.Sprintf("round %d: %v", i, err))
				d.ForceCleanup(ctx)
			}
		}
	}
	return res, ctx.Err()
}

// writeVolumeFiles makes, in dir, the block volume's file and the share
// with the benchmark's file in it, each size bytes written in full so
// that no variant pays for allocating blocks.
func writeVolumeFiles(dir string, size int64) (blockFile, share string, err error) {
	if err = os.Chmod(dir, 0o755); err != nil {
		return "", "", err
	}
	blockFile, share = filepath.Join(dir, "block"), filepath.Join(dir, "share")
	if err = os.Mkdir(share, 0o755); err != nil {
		return "", "", err
	}
	for _, f := range []string{blockFile, filepath.Join(share, "kvm-guest-iobench.dat")} {
		if err = writeFilled(f, size); err != nil {
			return "", "", err
		}
	}
	return blockFile, share, nil
}

// volBench is what every round of the volumes benchmark uses: the
// daemon, the environment, cgroups and libvirt, the loop device and the
// share, the results, and the raw domain taken from the first (a) VM.
type volBench struct {
	d     *daemon
	e     *env
	h     cgroup.Hierarchies
	l     *libvirt.Libvirt
	loop  string // the block volume's loop device
	share string // the shared directory
	res   *volumesResults
	raw   *rawVolumeVM
}

// runVariant runs variant v once in round i and records its figures.
func (vb *volBench) runVariant(ctx context.Context, v *ioVariant, i int) error {
	var out, target string
	var cpu float64
	var err error
	switch v.Key {
	case "a":
		var got *rawVolumeVM
		target = "disk:" + volumeSerial
		out, cpu, got, err = vb.podRun(ctx, volPod{name: "volumes-a", i: i, iobench: vb.res.iobenchArg(target), o: testenv.ContainerOptions{
			Devices: []*cri.Device{{ContainerPath: volumeDevicePath, HostPath: vb.loop, Permissions: "rwm"}},
		}, capture: vb.raw == nil})
		if got != nil {
			vb.raw = got
		}
	case "b":
		if vb.raw == nil {
			return errors.New("no kernel and initrd taken from an (a) VM")
		}
		target = "disk:" + volumeSerial
		out, cpu, err = vb.raw.run(ctx, vb, i, vb.res.iobenchArg(target))
	case "c":
		target = "dir:" + volumeSharePath
		out, cpu, _, err = vb.podRun(ctx, volPod{name: "volumes-c", i: i, iobench: vb.res.iobenchArg(target), o: testenv.ContainerOptions{
			Mounts: []*cri.Mount{{ContainerPath: volumeSharePath, HostPath: vb.share}},
		}})
	}
	if err != nil {
		return err
	}
	if err = v.addOutput(out, target, vb.res.InnerRuns, i); err != nil {
		return err
	}
	v.CPUSeconds, v.CPURounds = append(v.CPUSeconds, cpu), append(v.CPURounds, i)
	return nil
}

// roundOrder is the order the variants run in round i: as listed in even
// rounds, reversed in odd ones, so that no variant always runs first after
// the previous round's teardown (a host settling from it, or a pod's
// removal still finishing, would weigh on one variant only). Round 0 runs
// (a) first: (b) boots the kernel taken from it.
func roundOrder(vs []*ioVariant, i int) []*ioVariant {
	out := slices.Clone(vs)
	if i%2 == 1 {
		slices.Reverse(out)
	}
	return out
}

// writeFilled writes size bytes of pseudo-random data to path.
func writeFilled(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	rand.New(rand.NewSource(7)).Read(buf)
	for off := int64(0); off < size; off += int64(len(buf)) {
		if _, err := f.Write(buf[:min(int64(len(buf)), size-off)]); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// volPod is one VM pod of the volumes benchmark: its name and round, the
// guest's kvm-guest.iobench= argument, the volumes in o, and whether to
// capture what a raw domain needs to boot the same guest.
type volPod struct {
	name    string
	i       int
	iobench string
	o       testenv.ContainerOptions
	capture bool
}

// podRun runs a VM pod with the volumes in p.o whose guest runs the
// storage benchmark, waits for its figures and removes the pod. With
// p.capture, it also returns what a raw domain needs to boot the same
// guest.
func (vb *volBench) podRun(ctx context.Context, p volPod) (out string, cpu float64, raw *rawVolumeVM, retErr error) {
	d, e := vb.d, vb.e
	cl, err := d.DialCRI()
	if err != nil {
		return "", 0, nil, err
	}
	defer cl.Close()
	o := p.o
	o.MemoryLimit = int64(e.cfg.memoryMiB) << 20
	o.Annotations = map[string]string{annotations.KernelCmdline: volumeCmdline + p.iobench}
	pod, err := vmPod(ctx, podEnv{d: d, cl: cl, h: vb.h}, fmt.Sprintf("%s-%d", p.name, p.i), o)
	if err != nil {
		return "", 0, nil, err
	}
	defer func() { retErr = errors.Join(retErr, pod.stop()) }()
	if p.capture {
		if raw, err = captureRawVolumeVM(vb.l, d, e.rawDir); err != nil {
			return "", 0, nil, fmt.Errorf("take the shim VM's kernel, initrd and size: %w", err)
		}
	}
	out, cpu, err = waitIO(ctx, func() string { return pod.logPath }, pod.g)
	return out, cpu, raw, err
}

// waitIO waits until the console log (found by locate) has the guest's
// KVM-GUEST-IO done or a failure, and returns it with the CPU seconds
// QEMU's cgroup g used between the guest's start line and its done (read
// when the poll first sees each, every 100 ms of runs that take tens of
// seconds).
func waitIO(ctx context.Context, locate func() string, g *cgroup.Group) (string, float64, error) {
	ctx, cancel := context.WithTimeout(ctx, ioTimeout)
	defer cancel()
	var out string
	var ioErr, cpuErr error
	var startNs, endNs uint64
	usage := func() uint64 {
		s, err := g.Stats()
		cpuErr = errors.Join(cpuErr, err)
		return s.CPUUsageNs
	}
	err := testenv.Poll(ctx, 100*time.Millisecond, func() (bool, string) {
		b, _ := os.ReadFile(locate())
		out = string(b)
		var target string
		var done bool
		target, _, _, done, ioErr = parseIO(out)
		if target != "" && startNs == 0 {
			startNs = usage()
		}
		if done {
			endNs = usage()
		}
		return done || ioErr != nil, "no KVM-GUEST-IO done on the console; tail:\n" + testenv.Tail(out, 10)
	})
	switch {
	case ioErr != nil:
		return out, 0, ioErr
	case err != nil:
		return out, 0, err
	case cpuErr != nil:
		return out, 0, fmt.Errorf("QEMU's CPU time: %w", cpuErr)
	}
	return out, float64(endNs-startNs) / 1e9, nil
}

// loopNote says what the loop device's I/O mode means for the figures.
func loopNote(mode string) string {
	if mode == "buffered" {
		return "The loop device is buffered (-volume-loop buffered): the figures are the virtualization path's over the host page cache, which " +
			"is charged to the cgroup of the writer (the pod's memory-limited one for (a), (b)'s unlimited one), not the host disk's."
	}
	return "The loop device does direct I/O to its file (losetup --direct-io=on; -volume-loop direct, the default), as a real block device " +
		"has no host page cache between QEMU's cache=none and the disk: the figures are the host disk's through each path."
}

// buildVolumes adds the volume rows: each variant's figures, a/b with
// its target and c/a.
func (r *results) buildVolumes() {
	x := r.Volumes
	if x == nil {
		return
	}
	r.Notes = append(r.Notes,
		fmt.Sprintf("Volumes: measured in the guest by hack/guest/iobench (a static Go program in the test initramfs, started by /init from "+
			"kvm-guest.iobench= on the kernel command line): per run, %d MiB written then read in 1 MiB blocks, then %d random 4 KiB writes and "+
			"%d random 4 KiB reads at aligned offsets in those %d MiB (the same offsets on every target), O_DIRECT where the target takes it "+
			"(mode direct; else through the guest's page cache with the caches dropped before reads: mode cached), writes ended by fdatasync and "+
			"timed with it. "+
			"%d VMs per variant, run interleaved (one VM of each per round, in the order a, b, c in even rounds and c, b, a in odd ones), %d runs "+
			"each; a variant's medians and ranges are over all its runs, a ratio is taken per round (the median of one variant's runs in that "+
			"round over the other's) and given as the median and range over the rounds. The loop device's file and the shared directory are on "+
			"the host's disk file system (/var/tmp), written in full before the first run. "+
			"(a) and (c): CRI pods on containerd %s (kernel command line by the kvm.containerd.io/kernel-cmdline annotation); (b): a domain "+
			"written by hand with go-libvirt: the (a) VM's kernel, initrd, memory and vCPUs, one <disk type='block'> with cache=none io=native on "+
			"the same loop device, a serial console into a file, nothing else; its QEMU joins a cgroup of its own beside the pods' before it runs "+
			"(libvirt here manages no cpu controller: in the root cpu cgroup each QEMU thread would weigh as much as a whole pod's group when "+
			"other users load the cores). "+
			"Every guest boots with kvm-guest.agent=off (no QEMU guest agent: (b) has no channel for it), so the same guest processes share the "+
			"one emulated vCPU with the benchmark. %s Under TCG the guest's emulated CPU bounds every figure. QEMU CPU: the CPU time of the VM's "+
			"QEMU cgroup (the pod container's for (a) and (c), virtiofsd included in (c); (b)'s own) from the guest's start line to its done "+
			"line, read by the 100 ms poll of the console: the host cost of the same runs, which other users of the cores change far less than "+
			"the throughput.",
			x.MiB, x.Ops, x.Ops, x.MiB, x.VMs, x.InnerRuns, x.Flavour, loopNote(x.Loop)))
	byKey := map[string]*ioVariant{}
	for _, v := range x.Variants {
		byKey[v.Key] = v
		status := "measured"
		if len(v.Failures) > 0 {
			status = fmt.Sprintf("%d failed", len(v.Failures))
		}
		r.add("volumes (TCG)", v.Label,
			fmt.Sprintf("seq write %s MiB/s, seq read %s MiB/s; 4 KiB random write %s IOPS, random read %s IOPS; "+
				"I/O %s; QEMU CPU for a VM's runs %s s",
				spread(v.SeqWriteMiBs), spread(v.SeqReadMiBs), spread(v.RandWriteIOPS), spread(v.RandReadIOPS),
				v.Mode, spread(v.CPUSeconds)), "", status)
	}
	ratio := func(name string, x, y *ioVariant, target float64) {
		if x == nil || y == nil {
			return
		}
		var parts []string
		ok := true
		for _, m := range []struct {
			label  string
			xs, ys []float64
		}{{"seq write", x.SeqWriteMiBs, y.SeqWriteMiBs}, {"seq read", x.SeqReadMiBs, y.SeqReadMiBs},
			{"rand write", x.RandWriteIOPS, y.RandWriteIOPS}, {"rand read", x.RandReadIOPS, y.RandReadIOPS}} {
			qs := roundRatios(m.xs, x.Rounds, m.ys, y.Rounds)
			if len(qs) == 0 {
				parts = append(parts, m.label+" no paired rounds")
				ok = false
				continue
			}
			q := summarize(qs)
			r.Derived["volumes_ratio_"+strings.ReplaceAll(name, "/", "_")+"_"+strings.ReplaceAll(m.label, " ", "_")] = q.Median
			parts = append(parts, fmt.Sprintf("%s %.2f (%.2f-%.2f)", m.label, q.Median, q.Min, q.Max))
			ok = ok && q.Median >= target
		}
		value := strings.Join(parts, ", ") + " (per round: the medians of its VMs' runs; median and range over the rounds)"
		if target > 0 {
			r.add("volumes (TCG)", name+": shim block volume / raw libvirt domain", value, fmt.Sprintf(">= %.2f each", target), met(ok))
		} else {
			r.add("volumes (TCG)", name+": virtiofs share / shim block volume", value, "", "info")
		}
	}
	ratio("a/b", byKey["a"], byKey["b"], targetVolumeRatio)
	ratio("c/a", byKey["c"], byKey["a"], 0)
	if a, b := byKey["a"], byKey["b"]; a != nil && b != nil {
		if qs := roundRatios(a.CPUSeconds, a.CPURounds, b.CPUSeconds, b.CPURounds); len(qs) > 0 {
			q := summarize(qs)
			r.Derived["volumes_cpu_ratio_a_b"] = q.Median
			r.add("volumes (TCG)", "a/b: QEMU CPU seconds for the same runs",
				fmt.Sprintf("%.2f (%.2f-%.2f) (per round; above 1: the shim's VM costs the host more CPU for the same I/O)", q.Median, q.Min,
					q.Max), "", "info")
		}
	}
}

// roundRatios pairs two variants' samples by round: for each round both
// have, the median of x's samples over the median of y's.
func roundRatios(xs []float64, xr []int, ys []float64, yr []int) []float64 {
	byRound := func(v []float64, r []int) map[int][]float64 {
		m := map[int][]float64{}
		for i, x := range v {
			k := 0 // results without rounds: one round
			if len(r) == len(v) {
				k = r[i]
			}
			m[k] = append(m[k], x)
		}
		return m
	}
	mx, my := byRound(xs, xr), byRound(ys, yr)
	var rounds []int
	for k := range mx {
		if len(my[k]) > 0 {
			rounds = append(rounds, k)
		}
	}
	slices.Sort(rounds)
	var out []float64
	for _, k := range rounds {
		if d := summarize(my[k]).Median; d > 0 {
			out = append(out, summarize(mx[k]).Median/d)
		}
	}
	return out
}

// targetVolumeRatio is the target for a/b.
const targetVolumeRatio = 0.95

// spread renders a sample as "median (min-max, n=N)".
func spread(v []float64) string {
	if len(v) == 0 {
		return "no run"
	}
	s := summarize(v)
	f := func(x float64) string {
		if x >= 100 {
			return fmt.Sprintf("%.0f", x)
		}
		return fmt.Sprintf("%.1f", x)
	}
	return fmt.Sprintf("%s (%s-%s, n=%d)", f(s.Median), f(s.Min), f(s.Max), s.N)
}
