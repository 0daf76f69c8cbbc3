//go:build integration

package integration

import (
	"encoding/xml"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// domain is the part of a libvirt domain's XML (virsh dumpxml) the tests
// look at. It is parsed, not string-matched: libvirt rewrites the XML the
// shim defined (quotes, attribute order, added defaults).
type domain struct {
	Name string `xml:"name"`
	UUID string `xml:"uuid"`
	Meta struct {
		ContainerID string `xml:"vm>container-id"`
	} `xml:"metadata"`
	OS struct {
		Cmdline string `xml:"cmdline"`
	} `xml:"os"`
	VCPU struct {
		CPUSet  string `xml:"cpuset,attr"`
		Current int    `xml:"current,attr"` // vCPUs at start when below the maximum
		Count   int    `xml:",chardata"`    // the maximum
	} `xml:"vcpu"`
	CPUTune struct {
		VCPUPins []struct {
			VCPU   int    `xml:"vcpu,attr"`
			CPUSet string `xml:"cpuset,attr"`
		} `xml:"vcpupin"`
		EmulatorPin *struct {
			CPUSet string `xml:"cpuset,attr"`
		} `xml:"emulatorpin"`
	} `xml:"cputune"`
	MemoryBacking *struct {
		Pages []struct {
			Size int `xml:"size,attr"` // KiB
		} `xml:"hugepages>page"`
		Source struct {
			Type string `xml:"type,attr"`
		} `xml:"source"`
		Access struct {
			Mode string `xml:"mode,attr"`
		} `xml:"access"`
	} `xml:"memoryBacking"`
	NUMATune *struct {
		Memory struct {
			Mode    string `xml:"mode,attr"`
			NodeSet string `xml:"nodeset,attr"`
		} `xml:"memory"`
	} `xml:"numatune"`
	Devices struct {
		Emulator string `xml:"emulator"`
		Disks    []struct {
			Device string `xml:"device,attr"`
			Source struct {
				File string `xml:"file,attr"`
			} `xml:"source"`
			Target struct {
				Dev string `xml:"dev,attr"`
				Bus string `xml:"bus,attr"`
			} `xml:"target"`
			ReadOnly *struct{} `xml:"readonly"`
		} `xml:"disk"`
		Controllers []struct {
			Type  string `xml:"type,attr"`
			Model string `xml:"model,attr"`
		} `xml:"controller"`
	} `xml:"devices"`

	raw string
}

// vcpus is how many vCPUs the domain starts with.
func (d *domain) vcpus() int {
	if d.VCPU.Current > 0 {
		return d.VCPU.Current
	}
	return d.VCPU.Count
}

// dumpDomain reads and parses the live XML of a domain.
func dumpDomain(name string) (*domain, error) {
	out, err := virsh("dumpxml", name)
	if err != nil {
		return nil, err
	}
	d := &domain{raw: out}
	if err := xml.Unmarshal([]byte(out), d); err != nil {
		return nil, fmt.Errorf("parse XML of domain %s: %v\n%s", name, err, out)
	}
	return d, nil
}

// domainOf waits until this containerd's shim has defined the domain of
// container id (its metadata names the container) and returns it.
func (c *containerd) domainOf(t *testing.T, id string) *domain {
	t.Helper()
	var found *domain
	if err := poll(bootTimeout, func() (bool, string) {
		doms, err := c.ownDomains()
		if err != nil {
			return false, err.Error()
		}
		for _, name := range doms {
			if d, err := dumpDomain(name); err == nil && d.Meta.ContainerID == id {
				found = d
				return true, ""
			}
		}
		return false, fmt.Sprintf("no domain of container %s among this shim's domains %v", id, doms)
	}); err != nil {
		t.Fatal(err)
	}
	return found
}

// cpuList parses a Linux CPU or node list ("0-3,8,10-11") into a sorted set.
func cpuList(s string) ([]int, error) {
	var out []int
	seen := map[int]bool{}
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("cpu list %q: %v", s, err)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("cpu list %q: bad range %q", s, part)
			}
		}
		for i := a; i <= b; i++ {
			if !seen[i] {
				seen[i] = true
				out = append(out, i)
			}
		}
	}
	sort.Ints(out)
	return out, nil
}

// sameCPUs reports whether two CPU lists name the same set.
func sameCPUs(a, b string) (bool, error) {
	x, err := cpuList(a)
	if err != nil {
		return false, err
	}
	y, err := cpuList(b)
	if err != nil {
		return false, err
	}
	return fmt.Sprint(x) == fmt.Sprint(y), nil
}

// procStatus reads one field of /proc/<pid>/status (or of a thread:
// /proc/<pid>/task/<tid>/status when tid > 0).
func procStatus(pid, tid int, field string) (string, error) {
	path := fmt.Sprintf("/proc/%d/status", pid)
	if tid > 0 {
		path = fmt.Sprintf("/proc/%d/task/%d/status", pid, tid)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("%s has no %s", path, field)
}

// threadsNamed lists the threads of pid whose comm starts with prefix
// (libvirt starts QEMU with debug-threads=on: vCPU threads are "CPU 0/TCG"
// or "CPU 0/KVM").
func threadsNamed(pid int, prefix string) ([]int, error) {
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, err
	}
	var tids []int
	for _, e := range entries {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/comm", pid, tid))
		if err == nil && strings.HasPrefix(strings.TrimSpace(string(comm)), prefix) {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}

// waitDomainProcessesGone polls until no process of domain (the wrapper or
// QEMU) is left.
func waitDomainProcessesGone(domain string, timeout time.Duration) error {
	return poll(timeout, func() (bool, string) {
		ps := domainProcesses(domain)
		return len(ps) == 0, fmt.Sprintf("processes of domain %s: %v", domain, ps)
	})
}
