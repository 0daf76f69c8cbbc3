package cgroup

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Stats is what a group's controllers report, as the kernel names it.
// CPU and Memory hold cpu.stat and memory.stat of the group's version.
type Stats struct {
	Version int

	// CPUUsageNs is the group's total CPU time (v1 cpuacct.usage; v2
	// cpu.stat usage_usec × 1000); CPUUserNs and CPUSystemNs split it.
	CPUUsageNs, CPUUserNs, CPUSystemNs uint64
	CPU                                map[string]uint64

	// MemoryUsage is the charge now (v1 memory.usage_in_bytes, v2
	// memory.current); MemoryLimit the limit (max uint64 for none).
	MemoryUsage, MemoryLimit, MemoryMaxUsage, MemoryFailcnt uint64
	Memory                                                  map[string]uint64
	// MemoryEvents is v2's memory.events (oom, oom_kill, ...).
	MemoryEvents map[string]uint64

	PidsCurrent, PidsLimit uint64
}

// OOMKills is how many of the group's processes the kernel's OOM killer
// has killed: v1 memory.oom_control's oom_kill, v2 memory.events'. The
// kernel counts a kill in the victim's own group whichever limit ran out,
// the pod's above it included.
func (g *Group) OOMKills() (uint64, error) {
	r := reader{}
	var m map[string]uint64
	if g.h.Unified != "" {
		m = r.keyed(filepath.Join(g.dir(""), "memory.events"))
	} else {
		m = r.keyed(filepath.Join(g.dir("memory"), "memory.oom_control"))
	}
	if r.err != nil {
		return 0, fmt.Errorf("cgroup %s: %w", g.Path, r.err)
	}
	n, ok := m["oom_kill"]
	if !ok {
		return 0, fmt.Errorf("cgroup %s: the kernel counts no oom_kill", g.Path)
	}
	return n, nil
}

// unlimitedV1 is the smallest v1 memory.limit_in_bytes that means no
// limit: the kernel shows "none" as its page counter's maximum in bytes,
// 9223372036854771712 with 4 KiB pages.
const unlimitedV1 = 1 << 62

// MemoryLimit reads the memory limit of the group at path (v1
// memory.limit_in_bytes, v2 memory.max); ok is false when it has none or
// the group does not exist (yet).
func (h Hierarchies) MemoryLimit(path string) (limit uint64, ok bool, err error) {
	g, err := h.Group(path)
	if err != nil {
		return 0, false, err
	}
	file := filepath.Join(g.dir("memory"), "memory.limit_in_bytes")
	if h.Unified != "" {
		file = filepath.Join(g.dir(""), "memory.max")
	}
	b, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	} else if err != nil {
		return 0, false, fmt.Errorf("cgroup %s: %w", g.Path, err)
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, false, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("cgroup %s: %s: %w", g.Path, filepath.Base(file), err)
	}
	return n, n < unlimitedV1, nil
}

// Stats reads the group's statistics.
func (g *Group) Stats() (Stats, error) {
	if g.h.Unified != "" {
		return g.statsV2()
	}
	return g.statsV1()
}

func (g *Group) statsV1() (Stats, error) {
	s := Stats{Version: 1}
	var err error
	r := reader{}
	cpuacct, cpu, mem := g.dir("cpuacct"), g.dir("cpu"), g.dir("memory")
	s.CPUUsageNs = r.uint(filepath.Join(cpuacct, "cpuacct.usage"))
	s.CPUUserNs = r.optUint(filepath.Join(cpuacct, "cpuacct.usage_user"))
	s.CPUSystemNs = r.optUint(filepath.Join(cpuacct, "cpuacct.usage_sys"))
	s.CPU = r.keyed(filepath.Join(cpu, "cpu.stat"))
	s.MemoryUsage = r.uint(filepath.Join(mem, "memory.usage_in_bytes"))
	s.MemoryLimit = r.uint(filepath.Join(mem, "memory.limit_in_bytes"))
	s.MemoryMaxUsage = r.uint(filepath.Join(mem, "memory.max_usage_in_bytes"))
	s.MemoryFailcnt = r.uint(filepath.Join(mem, "memory.failcnt"))
	s.Memory = r.keyed(filepath.Join(mem, "memory.stat"))
	if p := g.dir("pids"); p != "" {
		s.PidsCurrent = r.uint(filepath.Join(p, "pids.current"))
		s.PidsLimit = r.uint(filepath.Join(p, "pids.max"))
	}
	if err = r.err; err != nil {
		return Stats{}, fmt.Errorf("cgroup %s: %w", g.Path, err)
	}
	return s, nil
}

func (g *Group) statsV2() (Stats, error) {
	s := Stats{Version: 2}
	r := reader{}
	d := g.dir("")
	s.CPU = r.keyed(filepath.Join(d, "cpu.stat"))
	s.CPUUsageNs = s.CPU["usage_usec"] * 1000
	s.CPUUserNs = s.CPU["user_usec"] * 1000
	s.CPUSystemNs = s.CPU["system_usec"] * 1000
	s.MemoryUsage = r.uint(filepath.Join(d, "memory.current"))
	s.MemoryLimit = r.uint(filepath.Join(d, "memory.max"))
	s.MemoryMaxUsage = r.optUint(filepath.Join(d, "memory.peak"))
	s.Memory = r.keyed(filepath.Join(d, "memory.stat"))
	s.MemoryEvents = r.keyed(filepath.Join(d, "memory.events"))
	s.MemoryFailcnt = s.MemoryEvents["max"]
	s.PidsCurrent = r.uint(filepath.Join(d, "pids.current"))
	s.PidsLimit = r.uint(filepath.Join(d, "pids.max"))
	if r.err != nil {
		return Stats{}, fmt.Errorf("cgroup %s: %w", g.Path, r.err)
	}
	return s, nil
}

// reader reads cgroup files and keeps the first error.
type reader struct{ err error }

// uint reads a one-number file; "max" is no limit.
func (r *reader) uint(path string) uint64 {
	b, err := os.ReadFile(path)
	if err != nil {
		r.fail(err)
		return 0
	}
	v := strings.TrimSpace(string(b))
	if v == "max" {
		return math.MaxUint64
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		r.fail(fmt.Errorf("%s: %w", path, err))
	}
	return n
}

// optUint reads a file that older kernels lack (0 then).
func (r *reader) optUint(path string) uint64 {
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return 0
	}
	return r.uint(path)
}

// keyed reads a "key value" per line file.
func (r *reader) keyed(path string) map[string]uint64 {
	f, err := os.Open(path)
	if err != nil {
		r.fail(err)
		return nil
	}
	defer f.Close()
	m := map[string]uint64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64); err == nil {
			m[k] = n
		}
	}
	if err := sc.Err(); err != nil {
		r.fail(err)
	}
	return m
}

func (r *reader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}
