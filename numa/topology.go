package numa

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
)

// Topology is the host's NUMA layout: read once (ReadTopology) and passed
// to Place, Usage and OpenStore as data. Nodes are in ascending ID order.
type Topology struct {
	Nodes []Node `json:"nodes"`
}

// Node is one host NUMA node.
type Node struct {
	// ID is the kernel's node number (nodeN in sysfs). IDs may have gaps.
	ID int `json:"id"`
	// CPUs are the node's online CPUs, ascending. A memory-only node
	// (CXL, persistent memory) has none and never receives a VM.
	CPUs []int `json:"cpus"`
	// MemoryBytes is the node's MemTotal.
	MemoryBytes uint64 `json:"memoryBytes"`
	// Distances[i] is the ACPI SLIT distance from this node to
	// Topology.Nodes[i] (10 is local), as in nodeN/distance.
	Distances []int `json:"distances"`
}

// Node returns the node with the given ID.
func (t *Topology) Node(id int) (*Node, bool) {
	for i := range t.Nodes {
		if t.Nodes[i].ID == id {
			return &t.Nodes[i], true
		}
	}
	return nil, false
}

// Validate reports what makes t unusable for placement: no nodes, nodes
// out of order or repeated, a CPU on two nodes, a distance row of the
// wrong length. ReadTopology's results are valid; hand-built ones (tests,
// the benchmark) are checked by OpenStore.
func (t *Topology) Validate() error {
	if t == nil || len(t.Nodes) == 0 {
		return fmt.Errorf("topology has no NUMA nodes: %w", errdefs.ErrInvalidArgument)
	}
	owner := map[int]int{}
	for i, n := range t.Nodes {
		if i > 0 && n.ID <= t.Nodes[i-1].ID {
			return fmt.Errorf("topology nodes must be in ascending ID order without repeats, node %d follows node %d: %w", n.ID, t.Nodes[i-1].ID,
				errdefs.ErrInvalidArgument)
		}
		if n.ID < 0 {
			return fmt.Errorf("topology node ID %d is negative: %w", n.ID, errdefs.ErrInvalidArgument)
		}
		if n.Distances != nil && len(n.Distances) != len(t.Nodes) {
			return fmt.Errorf("node %d has %d distances for %d nodes: %w", n.ID, len(n.Distances), len(t.Nodes), errdefs.ErrInvalidArgument)
		}
		for j, c := range n.CPUs {
			if c < 0 || c >= maxCPUID || (j > 0 && c <= n.CPUs[j-1]) {
				return fmt.Errorf("node %d CPUs must be distinct, ascending and below %d: %w", n.ID, maxCPUID, errdefs.ErrInvalidArgument)
			}
			if other, dup := owner[c]; dup {
				return fmt.Errorf("CPU %d is on both node %d and node %d: %w", c, other, n.ID, errdefs.ErrInvalidArgument)
			}
			owner[c] = n.ID
		}
	}
	return nil
}

// ReadTopology reads the NUMA topology of the host whose file system is
// rooted at root: "/" in production, a fake tree in tests. It reads, under
// root:
//
//	sys/devices/system/cpu/online           online CPUs
//	sys/devices/system/node/online          online nodes (else the nodeN directories)
//	sys/devices/system/node/nodeN/cpulist   the node's CPUs (kept: those online)
//	sys/devices/system/node/nodeN/meminfo   "Node N MemTotal: X kB"
//	sys/devices/system/node/nodeN/distance  distances to the online nodes, in order
//
// A kernel built without NUMA has no sys/devices/system/node: the host is
// then one node 0 holding every online CPU and the MemTotal of
// proc/meminfo, at distance 10 from itself.
func ReadTopology(root string) (*Topology, error) {
	sysCPU := filepath.Join(root, "sys/devices/system/cpu")
	sysNode := filepath.Join(root, "sys/devices/system/node")

	online, err := readCPUListFile(filepath.Join(sysCPU, "online"))
	if err != nil {
		return nil, err
	}

	if _, err = os.Stat(sysNode); errors.Is(err, fs.ErrNotExist) {
		meminfo := filepath.Join(root, "proc/meminfo")
		mem, readMemTotalErr := readMemTotal(meminfo, "MemTotal:")
		if readMemTotalErr != nil {
			return nil, readMemTotalErr
		}
		return &Topology{Nodes: []Node{{ID: 0, CPUs: online, MemoryBytes: mem, Distances: []int{10}}}}, nil
	} else if err != nil {
		return nil, fmt.Errorf("read NUMA topology: %w", err)
	}

	ids, err := nodeIDs(sysNode)
	if err != nil {
		return nil, err
	}
	t := &Topology{}
	for _, id := range ids {
		dir := filepath.Join(sysNode, "node"+strconv.Itoa(id))
		cpus, err := readCPUListFile(filepath.Join(dir, "cpulist"))
		if err != nil {
			return nil, err
		}
		cpus = slices.DeleteFunc(cpus, func(c int) bool { _, ok := slices.BinarySearch(online, c); return !ok })
		mem, err := readMemTotal(filepath.Join(dir, "meminfo"), fmt.Sprintf("Node %d MemTotal:", id))
		if err != nil {
			return nil, err
		}
		dist, err := readDistances(filepath.Join(dir, "distance"), len(ids))
		if err != nil {
			return nil, err
		}
		t.Nodes = append(t.Nodes, Node{ID: id, CPUs: cpus, MemoryBytes: mem, Distances: dist})
	}
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("NUMA topology under %s: %w", root, err)
	}
	return t, nil
}

// nodeIDs lists the online nodes: from the node/online list when the
// kernel provides it, else from the nodeN directories.
func nodeIDs(sysNode string) ([]int, error) {
	ids, err := readCPUListFile(filepath.Join(sysNode, "online"))
	if err == nil {
		if len(ids) == 0 {
			return nil, fmt.Errorf("%s lists no node: %w", filepath.Join(sysNode, "online"), errdefs.ErrInvalidArgument)
		}
		return ids, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	entries, err := os.ReadDir(sysNode)
	if err != nil {
		return nil, fmt.Errorf("read NUMA nodes: %w", err)
	}
	for _, e := range entries {
		if n, ok := strings.CutPrefix(e.Name(), "node"); ok {
			if id, err := strconv.Atoi(n); err == nil && id >= 0 {
				ids = append(ids, id)
			}
		}
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("%s has no nodeN directory: %w", sysNode, errdefs.ErrInvalidArgument)
	}
	slices.Sort(ids)
	return ids, nil
}

func readCPUListFile(path string) ([]int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read NUMA topology: %w", err)
	}
	cpus, err := ParseCPUList(string(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cpus, nil
}

// readMemTotal finds the line starting with prefix ("MemTotal:" in
// /proc/meminfo, "Node 3 MemTotal:" in a node's meminfo) and returns its
// value, given in kB, in bytes.
func readMemTotal(path, prefix string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read NUMA topology: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), prefix)
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("%s: cannot parse %q: %w", path, sc.Text(), errdefs.ErrInvalidArgument)
		}
		kb, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil || kb > 1<<53 {
			return 0, fmt.Errorf("%s: cannot parse %q: %w", path, sc.Text(), errdefs.ErrInvalidArgument)
		}
		return kb * 1024, nil
	}
	return 0, fmt.Errorf("%s has no %q line: %w", path, prefix, errdefs.ErrInvalidArgument)
}

func readDistances(path string, nodes int) ([]int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read NUMA topology: %w", err)
	}
	f := strings.Fields(string(b))
	if len(f) != nodes {
		return nil, fmt.Errorf("%s has %d distances for %d online nodes: %w", path, len(f), nodes, errdefs.ErrInvalidArgument)
	}
	d := make([]int, len(f))
	for i, s := range f {
		if d[i], err = strconv.Atoi(s); err != nil || d[i] <= 0 {
			return nil, fmt.Errorf("%s: distance %q is not a positive number: %w", path, s, errdefs.ErrInvalidArgument)
		}
	}
	return d, nil
}
