package numa

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// benchHost is 8 nodes of 8 CPUs and 64 GiB, holding 40 node-mode VMs of
// 2 vCPUs and 8 GiB (about 60% of memory) and 4 dedicated ones.
func benchHost(b *testing.B) (*Topology, []Placement) {
	topo := fakeTopology(b, uniform(8, 8, 64))
	var ps []Placement
	for i := range 44 {
		r := Request{Owner: fmt.Sprint("vm", i), VCPUs: 2, MemoryMiB: 8 * 1024}
		if i%11 == 10 {
			r.Mode = ModeDedicated
		}
		pl, err := Place(topo, Policy{}, ps, r)
		if err != nil {
			b.Fatal(err)
		}
		ps = append(ps, pl)
	}
	return topo, ps
}

func BenchmarkPlace8Nodes(b *testing.B) {
	topo, ps := benchHost(b)
	r := Request{Owner: "new", VCPUs: 4, MemoryMiB: 4096}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Place(topo, Policy{}, ps, r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReserve8Nodes times Reserve (lock, read, Place, write with
// fsyncs, rename, unlock) on the benchmark host's state, on the test's
// temporary directory ("disk") and, where there is one, on /dev/shm
// ("tmpfs", like /run). Each reserved VM is released untimed.
func BenchmarkReserve8Nodes(b *testing.B) {
	dirs := map[string]string{"disk": ""}
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		dirs["tmpfs"] = "/dev/shm"
	}
	for _, name := range []string{"disk", "tmpfs"} {
		parent, ok := dirs[name]
		if !ok {
			continue
		}
		b.Run("fs="+name, func(b *testing.B) {
			dir := b.TempDir()
			if parent != "" {
				var err error
				if dir, err = os.MkdirTemp(parent, "numa-bench-"); err != nil {
					b.Skip(err)
				}
				b.Cleanup(func() { os.RemoveAll(dir) })
			}
			topo, ps := benchHost(b)
			s, err := OpenStore(filepath.Join(dir, "numa.json"), topo, Policy{})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := s.Reconcile(ps); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				owner := fmt.Sprint("new", i)
				if _, err := s.Reserve(Request{Owner: owner, VCPUs: 4, MemoryMiB: 4096}); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := s.Release(owner); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}
