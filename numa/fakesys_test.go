package numa

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeNode describes one node of a fake sysfs tree.
type fakeNode struct {
	cpus   string // cpulist
	memGiB float64
}

// uniform returns n nodes of cpus CPUs and memGiB each, numbered in order.
func uniform(n, cpus int, memGiB float64) []fakeNode {
	out := make([]fakeNode, n)
	for i := range out {
		out[i] = fakeNode{cpus: fmt.Sprintf("%d-%d", i*cpus, (i+1)*cpus-1), memGiB: memGiB}
	}
	return out
}

// writeFile writes content under root, making directories.
func writeFile(t testing.TB, root, rel, content string) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// fakeSysfs builds, in a new directory, the files ReadTopology reads for
// nodes 0..len(nodes)-1: all their CPUs online, distance 10 to itself,
// 12 to the other node of its pair ("socket") and 21 to the rest.
func fakeSysfs(t testing.TB, nodes []fakeNode) string {
	t.Helper()
	root := t.TempDir()
	var all []string
	for i, n := range nodes {
		dir := fmt.Sprintf("sys/devices/system/node/node%d/", i)
		writeFile(t, root, dir+"cpulist", n.cpus+"\n")
		kb := uint64(n.memGiB * 1024 * 1024)
		writeFile(t, root, dir+"meminfo", fmt.Sprintf(
			"Node %d MemTotal:       %d kB\nNode %d MemFree:        %d kB\nNode %d MemUsed:        0 kB\n", i, kb, i, kb, i))
		var d []string
		for j := range nodes {
			switch {
			case i == j:
				d = append(d, "10")
			case i/2 == j/2:
				d = append(d, "12")
			default:
				d = append(d, "21")
			}
		}
		writeFile(t, root, dir+"distance", strings.Join(d, " ")+"\n")
		if n.cpus != "" {
			all = append(all, n.cpus)
		}
	}
	writeFile(t, root, "sys/devices/system/node/online", fmt.Sprintf("0-%d\n", len(nodes)-1))
	writeFile(t, root, "sys/devices/system/cpu/online", strings.Join(all, ",")+"\n")
	return root
}

// fakeTopology reads a fake sysfs tree of the nodes.
func fakeTopology(t testing.TB, nodes []fakeNode) *Topology {
	t.Helper()
	topo, err := ReadTopology(fakeSysfs(t, nodes))
	if err != nil {
		t.Fatal(err)
	}
	return topo
}
