package numa

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// Describe writes, for people (the shim's `check`), the topology, the
// policy, each node's use and every reservation, then any overlap that
// Overlaps finds.
func Describe(w io.Writer, t *Topology, p Policy, ps []Placement) error {
	p = p.WithDefaults()
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "policy: cpu_threshold %g, mem_threshold %g, min_shared_cpus %d, allow_spread %t, reserved_cpus %q\n",
		p.CPUThreshold, p.MemThreshold, p.MinSharedCPUs, p.AllowSpread, FormatCPUList(p.ReservedCPUs))
	fmt.Fprintln(tw, "node\tcpus\tmemory\tdistances\tvms\tvcpus/shared\tdedicated\tmemory used\tcpu ratio\tmem ratio\t|cpu-mem|")
	for i, u := range Usage(t, p, ps) {
		n := &t.Nodes[i]
		dist := make([]string, len(n.Distances))
		for j, d := range n.Distances {
			dist[j] = strconv.Itoa(d)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%d/%d (%.2f)\t%s\t%s\t%.2f\t%.2f\t%.2f\n",
			u.Node, orDash(FormatCPUList(n.CPUs)), formatBytes(float64(n.MemoryBytes)), orDash(strings.Join(dist, " ")),
			u.VMs, u.VCPUs, len(u.SharedCPUs), u.SharedRatio, orDash(FormatCPUList(u.DedicatedCPUs)),
			formatMiB(u.MemoryMiB), u.CPURatio, u.MemRatio, u.Imbalance())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(tw, "\nreservations: %d\n", len(ps))
	if len(ps) > 0 {
		fmt.Fprintln(tw, "owner\tmode\tnodes\tvcpus\tmemory\tcpus\temulator cpus")
	}
	for _, pl := range ps {
		nodes := make([]string, len(pl.Nodes))
		for j, id := range pl.Nodes {
			nodes[j] = strconv.Itoa(id)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", pl.Owner, pl.Mode, orDash(strings.Join(nodes, ",")),
			pl.VCPUs, formatMiB(int64(pl.MemoryMiB)), orDash(FormatCPUList(pl.CPUs)), orDash(FormatCPUList(pl.EmulatorCPUs)))
	}
	for _, o := range Overlaps(ps) {
		what := "BROKEN exclusivity"
		if o.Stale {
			what = "stale cpuset, placed before the dedicated VM; re-pin it to its node's shared CPUs"
		}
		fmt.Fprintf(tw, "overlap: %s runs on CPUs %s dedicated to %s (%s)\n", o.Owner, FormatCPUList(o.CPUs), o.DedicatedTo, what)
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
