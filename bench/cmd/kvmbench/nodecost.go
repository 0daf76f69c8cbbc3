package main

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// nodeCost is what a daemon's VM pods cost the node beside their shims:
// the QEMU processes that run the guests, the virtiofsd processes of their
// shared volumes, and what libvirtd and virtlogd grew by while they ran.
type nodeCost struct {
	// QEMURSSKiB and QEMUPSSKiB are per VM, from its QEMU's smaps_rollup.
	QEMURSSKiB []int `json:"qemu_rss_kib"`
	QEMUPSSKiB []int `json:"qemu_pss_kib"`
	// Virtiofsd is how many virtiofsd processes served these VMs;
	// VirtiofsdRSSKiB their summed RSS.
	Virtiofsd       int `json:"virtiofsd"`
	VirtiofsdRSSKiB int `json:"virtiofsd_rss_kib"`
	// DaemonGrowthKiB is libvirtd's and virtlogd's RSS with the pods
	// running less their RSS before the first pod, per daemon.
	DaemonGrowthKiB map[string]int `json:"daemon_rss_growth_kib"`
}

// nodeDaemons are the host daemons every VM pod uses.
var nodeDaemons = []string{"libvirtd", "virtlogd"}

// daemonRSS reads the RSS of libvirtd and virtlogd (summed when a name has
// more than one process).
func daemonRSS() (map[string]int, error) {
	out := map[string]int{}
	for _, name := range nodeDaemons {
		procs := testenv.ProcessesMatching(func(args []string) bool { return filepath.Base(args[0]) == name })
		if len(procs) == 0 {
			return nil, fmt.Errorf("no %s process", name)
		}
		for _, p := range procs {
			m, err := smapsRollup(p.Pid)
			if err != nil {
				return nil, err
			}
			out[name] += m["Rss"]
		}
	}
	return out, nil
}

// readNodeCost measures the QEMU and virtiofsd processes of d's domains
// and the daemons' growth against before.
func readNodeCost(d *daemon, n int, before map[string]int) (nodeCost, error) {
	var c nodeCost
	names, err := d.Domains()
	if err != nil {
		return c, err
	}
	if len(names) != n {
		return c, fmt.Errorf("%d domains for %d VM pods: %v", len(names), n, names)
	}
	for _, name := range names {
		qemu := testenv.ProcessesMatching(func(args []string) bool {
			return strings.HasPrefix(filepath.Base(args[0]), "qemu-system-") &&
				slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "guest="+name+",") })
		})
		if len(qemu) != 1 {
			return c, fmt.Errorf("domain %s: %d QEMU processes", name, len(qemu))
		}
		m, err := smapsRollup(qemu[0].Pid)
		if err != nil {
			return c, err
		}
		c.QEMURSSKiB = append(c.QEMURSSKiB, m["Rss"])
		c.QEMUPSSKiB = append(c.QEMUPSSKiB, m["Pss"])
	}
	// virtiofsd runs with its shared directory below the shim's state_dir
	// or the pod's volume paths; those of this daemon's pods name its dir.
	for _, p := range testenv.ProcessesMatching(func(args []string) bool {
		return strings.Contains(filepath.Base(args[0]), "virtiofsd") &&
			slices.ContainsFunc(args, func(a string) bool { return strings.Contains(a, d.Dir) })
	}) {
		m, err := smapsRollup(p.Pid)
		if err != nil {
			return c, err
		}
		c.Virtiofsd++
		c.VirtiofsdRSSKiB += m["Rss"]
	}
	after, rssErr := daemonRSS()
	if rssErr != nil {
		return c, rssErr
	}
	c.DaemonGrowthKiB = map[string]int{}
	for _, name := range nodeDaemons {
		c.DaemonGrowthKiB[name] = after[name] - before[name]
	}
	return c, nil
}

// summary is the node cost per VM pod in one line.
func (c nodeCost) summary(pods int) string {
	mib := func(kib int) float64 { return float64(kib) / 1024 }
	per := func(kib int) float64 { return mib(kib) / float64(pods) }
	vfs := "no virtiofsd (no shared volume in these pods)"
	if c.Virtiofsd > 0 {
		vfs = fmt.Sprintf("virtiofsd %.1f MiB RSS per pod (%d processes)", per(c.VirtiofsdRSSKiB), c.Virtiofsd)
	}
	return fmt.Sprintf("QEMU RSS median %.1f MiB (max %.1f), PSS median %.1f MiB; libvirtd %+.2f MiB, virtlogd %+.2f MiB per pod; %s",
		mib(medianInt(c.QEMURSSKiB)), mib(slices.Max(c.QEMURSSKiB)), mib(medianInt(c.QEMUPSSKiB)),
		per(c.DaemonGrowthKiB["libvirtd"]), per(c.DaemonGrowthKiB["virtlogd"]), vfs)
}

// medianInt is the median of v (the upper one of an even count); v is not
// empty.
func medianInt(v []int) int {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
