package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// clockTick is the unit of the CPU times in /proc/<pid>/stat (USER_HZ,
// 100 on every Linux architecture Go supports here).
const clockTick = 10 * time.Millisecond

// controlPlane is the CPU time the control plane of one containerd has
// used so far, by component: the daemon itself (with the children it has
// reaped: `shim start` invocations, CNI plugins), every shim process
// serving it (with its reaped children: mkfs.vfat and mcopy for ours, runc
// for runc's), and the libvirt daemons. The QEMU processes, which run the
// guests, and the containers' own processes are not part of it.
type controlPlane map[string]time.Duration

// Components of controlPlane.
const (
	cpContainerd = "containerd"
	cpShims      = "shims"
	cpLibvirtd   = "libvirtd"
	cpVirtlogd   = "virtlogd"
)

// sampleControlPlane reads the CPU times now. A shim that has already
// exited is missing from the sum: sample before the pods are removed.
func sampleControlPlane(d *daemon) controlPlane {
	cp := controlPlane{}
	cp[cpContainerd] = processCPU(d.Pid(), true)
	for _, p := range d.ShimProcesses() {
		cp[cpShims] += processCPU(p.Pid, true)
	}
	for _, name := range []string{cpLibvirtd, cpVirtlogd} {
		for _, p := range testenv.ProcessesMatching(func(args []string) bool {
			return len(args) > 0 && filepath.Base(args[0]) == name
		}) {
			// libvirtd's reaped children are the helpers it forks to
			// start QEMU, which are part of starting a VM.
			cp[name] += processCPU(p.Pid, true)
		}
	}
	return cp
}

// sub returns the CPU used between before and cp, per component.
func (cp controlPlane) sub(before controlPlane) controlPlane {
	out := controlPlane{}
	for k, v := range cp {
		out[k] = v - before[k]
	}
	return out
}

func (cp controlPlane) total() time.Duration {
	var t time.Duration
	for _, v := range cp {
		t += v
	}
	return t
}

// msPerPod converts to milliseconds per pod for the JSON results.
func (cp controlPlane) msPerPod(pods int) map[string]float64 {
	out := map[string]float64{}
	for k, v := range cp {
		out[k] = ms(v) / float64(pods)
	}
	return out
}

// processCPU is utime+stime of pid (and cutime+cstime with children), 0
// if the process is gone.
func processCPU(pid int, children bool) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	ticks, err := statCPUTicks(string(b), children)
	if err != nil {
		logf("cpu: pid %d: %v", pid, err)
		return 0
	}
	return time.Duration(ticks) * clockTick
}

// statCPUTicks parses the CPU fields of a /proc/<pid>/stat line: utime and
// stime (fields 14 and 15), and cutime and cstime (16 and 17). The command
// name (field 2) may contain spaces and parentheses, so fields are counted
// from its last ')'.
func statCPUTicks(stat string, children bool) (int64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed stat %q", stat)
	}
	f := strings.Fields(stat[i+1:]) // f[0] is field 3 (state)
	if len(f) < 15 {
		return 0, fmt.Errorf("stat has %d fields after the command", len(f))
	}
	n := 2
	if children {
		n = 4
	}
	var sum int64
	for _, s := range f[11 : 11+n] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("stat field %q: %w", s, err)
		}
		sum += v
	}
	return sum, nil
}
