package numa

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestReadTopology(t *testing.T) {
	for _, tc := range []struct {
		name  string
		nodes []fakeNode
	}{
		{"1 node", uniform(1, 4, 8)},
		{"2 nodes", uniform(2, 32, 256)},
		{"4 nodes", uniform(4, 16, 128)},
		{"8 nodes", uniform(8, 8, 64)},
		{"uneven", []fakeNode{{"0-23", 192}, {"24-31", 64}, {"32-47", 128}, {"48-55,60-63", 31.5}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topo := fakeTopology(t, tc.nodes)
			if len(topo.Nodes) != len(tc.nodes) {
				t.Fatalf("got %d nodes, want %d", len(topo.Nodes), len(tc.nodes))
			}
			for i, n := range topo.Nodes {
				want, _ := ParseCPUList(tc.nodes[i].cpus)
				if n.ID != i || !slices.Equal(n.CPUs, want) {
					t.Errorf("node %d: id %d cpus %v, want %v", i, n.ID, n.CPUs, want)
				}
				if wantMem := uint64(tc.nodes[i].memGiB * (1 << 30)); n.MemoryBytes != wantMem {
					t.Errorf("node %d: memory %d, want %d", i, n.MemoryBytes, wantMem)
				}
				if len(n.Distances) != len(tc.nodes) || n.Distances[i] != 10 {
					t.Errorf("node %d: distances %v", i, n.Distances)
				}
			}
		})
	}
}

func TestReadTopologyOfflineSparseAndMemoryOnly(t *testing.T) {
	root := fakeSysfs(t, []fakeNode{{"0-3", 8}, {"", 16}, {"4-7", 8}})
	// Node 1 is a memory-only node; CPU 5 is offline.
	writeFile(t, root, "sys/devices/system/cpu/online", "0-4,6-7\n")
	topo, err := ReadTopology(root)
	if err != nil {
		t.Fatal(err)
	}
	if got := FormatCPUList(topo.Nodes[2].CPUs); got != "4,6-7" {
		t.Errorf("node 2 cpus %q, want offline CPU 5 dropped", got)
	}
	if len(topo.Nodes[1].CPUs) != 0 {
		t.Errorf("memory-only node has CPUs %v", topo.Nodes[1].CPUs)
	}
	// A memory-only node never receives a VM.
	for i := range 3 {
		pl, placeErr := Place(topo, Policy{}, nil, Request{Owner: "vm", VCPUs: 1, MemoryMiB: 1024 * (i + 1)})
		if placeErr != nil || pl.Nodes[0] == 1 {
			t.Errorf("placed on %v, %v", pl.Nodes, placeErr)
		}
	}

	// Sparse node IDs, listed by node/online.
	root = t.TempDir()
	writeFile(t, root, "sys/devices/system/cpu/online", "0-3")
	writeFile(t, root, "sys/devices/system/node/online", "0,2")
	for _, id := range []string{"0", "2"} {
		dir := "sys/devices/system/node/node" + id + "/"
		cpus := map[string]string{"0": "0-1", "2": "2-3"}[id]
		writeFile(t, root, dir+"cpulist", cpus)
		writeFile(t, root, dir+"meminfo", "Node "+id+" MemTotal: 1048576 kB\n")
		writeFile(t, root, dir+"distance", map[string]string{"0": "10 20", "2": "20 10"}[id])
	}
	topo, err = ReadTopology(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(topo.Nodes) != 2 || topo.Nodes[1].ID != 2 || topo.Nodes[1].Distances[0] != 20 {
		t.Errorf("sparse nodes read as %+v", topo.Nodes)
	}
}

func TestReadTopologyWithoutNUMA(t *testing.T) {
	root := t.TempDir()
	writeFile(t, root, "sys/devices/system/cpu/online", "0-5\n")
	writeFile(t, root, "proc/meminfo", "MemTotal:       16384000 kB\nMemFree:        1000 kB\n")
	topo, err := ReadTopology(root)
	if err != nil {
		t.Fatal(err)
	}
	want := Node{ID: 0, CPUs: []int{0, 1, 2, 3, 4, 5}, MemoryBytes: 16384000 * 1024, Distances: []int{10}}
	if len(topo.Nodes) != 1 || topo.Nodes[0].ID != 0 || !slices.Equal(topo.Nodes[0].CPUs, want.CPUs) ||
		topo.Nodes[0].MemoryBytes != want.MemoryBytes || !slices.Equal(topo.Nodes[0].Distances, want.Distances) {
		t.Errorf("got %+v, want one node %+v", topo.Nodes, want)
	}
}

func TestReadTopologyErrors(t *testing.T) {
	for _, tc := range []struct {
		name, file, content, want string
	}{
		{"bad cpulist", "sys/devices/system/node/node1/cpulist", "4-x", "node1/cpulist"},
		{"no MemTotal", "sys/devices/system/node/node0/meminfo", "Node 0 MemFree: 1 kB\n", `no "Node 0 MemTotal:" line`},
		{"MemTotal not in kB", "sys/devices/system/node/node0/meminfo", "Node 0 MemTotal: 1 MB\n", "cannot parse"},
		{"short distance row", "sys/devices/system/node/node1/distance", "21\n", "1 distances for 2 online nodes"},
		{"CPU on two nodes", "sys/devices/system/node/node1/cpulist", "3-7", "CPU 3 is on both node 0 and node 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := fakeSysfs(t, uniform(2, 4, 4))
			writeFile(t, root, tc.file, tc.content)
			_, err := ReadTopology(root)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to say %q", err, tc.want)
			}
		})
	}
	root := fakeSysfs(t, uniform(2, 4, 4))
	os.Remove(filepath.Join(root, "sys/devices/system/node/node1/meminfo"))
	if _, err := ReadTopology(root); err == nil || !strings.Contains(err.Error(), "node1/meminfo") {
		t.Errorf("missing meminfo: err = %v", err)
	}
	if err := (&Topology{}).Validate(); !errdefs.IsInvalidArgument(err) {
		t.Errorf("empty topology: err = %v", err)
	}
}
