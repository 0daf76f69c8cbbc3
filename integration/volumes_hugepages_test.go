//go:build integration

package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// hugePagesPath is the host's count of reserved 2 MiB pages.
const hugePagesPath = "/proc/sys/vm/nr_hugepages"

// reserveHugePages raises the host's 2 MiB page pool by n and puts the
// old count back at the end of the test (register it before the pods, so
// that it runs after they are gone).
func reserveHugePages(t *testing.T, n int) {
	t.Helper()
	if _, err := os.Stat("/sys/fs/cgroup/hugetlb"); err != nil && !isCgroup2() {
		t.Skip("no hugetlb cgroup controller mounted: containerd's CRI drops huge page limits without it (run hack/setup-host.sh)")
	}
	b, err := os.ReadFile(hugePagesPath)
	if err != nil {
		t.Fatal(err)
	}
	old, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("%s: %v", hugePagesPath, err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(hugePagesPath, []byte(strconv.Itoa(old)), 0o644); err != nil {
			t.Errorf("restore %s to %d: %v", hugePagesPath, old, err)
		}
	})
	if err := os.WriteFile(hugePagesPath, []byte(strconv.Itoa(old+n)), 0o644); err != nil {
		t.Fatal(err)
	}
	if free := hugePagesFree(t); free < n {
		t.Skipf("asked the kernel for %d more 2 MiB pages, %d are free (host memory too fragmented)", n, free)
	}
}

// hugePagesFree reads HugePages_Free of /proc/meminfo.
func hugePagesFree(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "HugePages_Free:" {
			n, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatalf("/proc/meminfo: %q", l)
			}
			return n
		}
	}
	t.Fatal("/proc/meminfo has no HugePages_Free")
	return 0
}

func isCgroup2() bool {
	_, err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
	return err == nil
}

// TestCRIVolumesHugePagesNUMA boots, on both flavours, a direct-boot VM
// pod that asks for 2 MiB huge pages and NUMA node placement and has a
// raw block volume and a virtiofs share: the domain backs guest memory
// with huge pages from memfd, shared (what virtiofsd needs), bound to the
// placement's node; QEMU holds the pages; the guest finds the disk by its
// serial, reads the share and writes into it.
func TestCRIVolumesHugePagesNUMA(t *testing.T) {
	s := requireKVM(t, "kernel", "pause")
	image := s.images["kernel"].ref
	const memMiB = 128
	pages := memMiB / 2
	s.forEachFlavour(t, func(t *testing.T, c *containerd) {
		reserveHugePages(t, pages+8)
		c.cleanupAfter(t)
		cl := c.cri(t)
		block := loopDevice(t, 8<<20, "KVM-GUEST-BLOCK on-huge-pages\n")
		share := hostVolumeDir(t, "share")
		if err := os.WriteFile(filepath.Join(share, "kvm-guest-read"), []byte("hello-huge-pages\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg := containerConfig("vm", image, map[string]string{annNUMAMode: "node"})
		cfg.Linux.Resources.MemoryLimitInBytes = memMiB << 20
		cfg.Linux.Resources.HugepageLimits = []*cri.HugepageLimit{{PageSize: "2MB", Limit: memMiB << 20}}
		cfg.Devices = []*cri.Device{{ContainerPath: "/dev/xvda", HostPath: block, Permissions: "rwm"}}
		cfg.Mounts = []*cri.Mount{{ContainerPath: "/shared", HostPath: share}}
		freeBefore := hugePagesFree(t)
		v := c.startVolumePod(t, cl, "vm-hugepages", cfg)

		d := c.domainOf(t, v.cid)
		mb := d.MemoryBacking
		if mb == nil || len(mb.Pages) != 1 || mb.Pages[0].Size != 2048 || mb.Source.Type != "memfd" || mb.Access.Mode != "shared" {
			t.Errorf("want <memoryBacking> with 2048 KiB huge pages, <source type='memfd'> and <access mode='shared'>:\n%s", d.raw)
		}
		if l := guestLine(t, v, "KVM-GUEST-DISK dev-xvda "); !strings.HasSuffix(l, "ro=0 data=KVM-GUEST-BLOCK on-huge-pages") {
			t.Errorf("raw block volume: %q, want it writable by serial dev-xvda with the host's first line", l)
		}
		if l := guestLine(t, v, "KVM-GUEST-SHARE shared "); l != "KVM-GUEST-SHARE shared /shared write=ok" {
			t.Errorf("share: %q, want mounted at /shared and writable", l)
		}
		if l := guestLine(t, v, "KVM-GUEST-FILE /shared/"); l != "KVM-GUEST-FILE /shared/kvm-guest-read hello-huge-pages" {
			t.Errorf("the host's file in the guest: %q", l)
		}
		if b, err := os.ReadFile(filepath.Join(share, ".kvm-guest-wrote")); err != nil || string(b) != "shared\n" {
			t.Errorf("the guest's file in the share on the host: %q, %v", b, err)
		}
		guestLine(t, v, "KVM-GUEST-DISK-WROTE dev-xvda ")

		// The guest runs on huge pages: QEMU took the guest's RAM from
		// the pool, on the placement's node.
		if used := freeBefore - hugePagesFree(t); used < pages {
			t.Errorf("%d huge pages taken from the pool while the VM runs, want at least %d (%d MiB of guest RAM)", used, pages, memMiB)
		}
		_, pid, err := c.taskStatus(nsCRI, v.cid)
		if err != nil || pid <= 0 {
			t.Fatalf("QEMU pid %d: %v", pid, err)
		}
		checkNUMATune(t, d, pid)
		if d.NUMATune != nil {
			checkPagesOnNodes(t, pid, d.NUMATune.Memory.NodeSet)
		}

		if err := cl.stopContainer(v); err != nil {
			t.Error(err)
		}
		cl.removePod(t, v)
		assertNothingLeft(t, c, v.shimIDs()...)
		if err := poll(30*time.Second, func() (bool, string) {
			free := hugePagesFree(t)
			return free >= freeBefore, fmt.Sprintf("%d huge pages free after the pod, %d before it", free, freeBefore)
		}); err != nil {
			t.Error(err)
		}
	})
}
