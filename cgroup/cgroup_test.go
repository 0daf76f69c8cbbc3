package cgroup

import (
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// This host's mountinfo shape: cgroup v1, cpu and cpuacct apart, a
// unified mount at /sys/fs/cgroup/unified (hybrid).
const mountinfoV1 = `25 30 0:22 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
26 25 0:23 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
27 25 0:24 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
28 25 0:25 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
29 25 0:26 / /sys/fs/cgroup/memory rw,relatime shared:5 - cgroup cgroup rw,memory
30 25 0:27 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
31 25 0:28 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`

const mountinfoV1Joined = `26 25 0:23 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
29 25 0:26 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
`

//nolint:lll // a mountinfo line as the kernel writes it
const mountinfoV2 = `35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
`

func TestParseMountinfo(t *testing.T) {
	h, err := ParseMountinfo(strings.NewReader(mountinfoV1), DefaultRoot)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"memory": "/sys/fs/cgroup/memory", "cpu": "/sys/fs/cgroup/cpu", "cpuacct": "/sys/fs/cgroup/cpuacct",
		"pids": "/sys/fs/cgroup/pids"}
	if h.Version() != 1 || len(h.V1) != len(want) {
		t.Fatalf("v1 host: got %+v", h)
	}
	for c, m := range want {
		if h.V1[c] != m {
			t.Errorf("controller %s at %q, want %q", c, h.V1[c], m)
		}
	}

	h, err = ParseMountinfo(strings.NewReader(mountinfoV1Joined), DefaultRoot)
	if err != nil {
		t.Fatal(err)
	}
	g, _ := h.Group("/kubepods/pod1/c1")
	if dirs := g.Dirs(); len(dirs) != 2 || dirs[0] != "/sys/fs/cgroup/memory/kubepods/pod1/c1" ||
		dirs[1] != "/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/c1" {
		t.Errorf("joined cpu,cpuacct: dirs %q, want memory's and cpu,cpuacct's once each", dirs)
	}

	h, err = ParseMountinfo(strings.NewReader(mountinfoV2), DefaultRoot)
	if err != nil || h.Version() != 2 || h.Unified != "/sys/fs/cgroup" {
		t.Fatalf("v2 host: %+v, %v", h, err)
	}

	_, err = ParseMountinfo(strings.NewReader("26 25 0:23 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"), DefaultRoot)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "memory") {
		t.Errorf("no memory controller: got %v, want FailedPrecondition naming it", err)
	}
}

func TestCleanPath(t *testing.T) {
	for _, c := range []struct {
		in, want string
		err      error
	}{
		{"/kubepods/burstable/pod1/abc", "/kubepods/burstable/pod1/abc", nil},
		{"/default//vm/", "/default/vm", nil},
		{"kubepods-pod1.slice:cri-containerd:abc", "", ErrSystemdPath},
		{"relative/x", "", errdefs.ErrInvalidArgument},
		{"/kubepods/../../etc", "", errdefs.ErrInvalidArgument},
		{"/a/./b", "", errdefs.ErrInvalidArgument},
		{"/", "", errdefs.ErrInvalidArgument},
		{"//", "", errdefs.ErrInvalidArgument},
		{"/a\nb", "", errdefs.ErrInvalidArgument},
	} {
		got, err := CleanPath(c.in)
		if got != c.want || (c.err == nil) != (err == nil) || (c.err != nil && !errors.Is(err, c.err)) {
			t.Errorf("CleanPath(%q) = %q, %v; want %q, %v", c.in, got, err, c.want, c.err)
		}
	}
}

// fakeV1 builds a v1 tree: one dir per controller under root.
func fakeV1(t *testing.T) Hierarchies {
	t.Helper()
	root := t.TempDir()
	h := Hierarchies{V1: map[string]string{}, fake: true}
	for _, c := range V1Controllers {
		h.V1[c] = filepath.Join(root, c)
		if err := os.Mkdir(h.V1[c], 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

func TestV1FakeTree(t *testing.T) {
	h := fakeV1(t)
	g, err := h.Group("/kubepods/pod1/vm")
	if err != nil {
		t.Fatal(err)
	}
	created, err := g.Create()
	if err != nil || !created {
		t.Fatalf("Create: %v, %v", created, err)
	}
	if again, createErr := g.Create(); createErr != nil || again {
		t.Errorf("second Create: created %v, %v; want an existing group kept", again, createErr)
	}
	if err = g.Join(4242); err != nil {
		t.Fatal(err)
	}
	for _, c := range V1Controllers {
		b, readFileErr := os.ReadFile(filepath.Join(h.V1[c], "kubepods/pod1/vm/cgroup.procs"))
		if readFileErr != nil || !strings.Contains(string(b), "4242\n") {
			t.Errorf("%s cgroup.procs = %q, %v; want 4242", c, b, readFileErr)
		}
	}
	if pids, procsErr := g.Procs(); procsErr != nil || len(pids) != 1 || pids[0] != 4242 {
		t.Errorf("Procs = %v, %v", pids, procsErr)
	}

	files := map[string]string{
		"cpuacct/cpuacct.usage":            "3000000000\n",
		"cpuacct/cpuacct.usage_user":       "2000000000\n",
		"cpuacct/cpuacct.usage_sys":        "1000000000\n",
		"cpu/cpu.stat":                     "nr_periods 10\nnr_throttled 2\nthrottled_time 500\n",
		"memory/memory.usage_in_bytes":     "600000000\n",
		"memory/memory.limit_in_bytes":     "9223372036854771712\n",
		"memory/memory.max_usage_in_bytes": "700000000\n",
		"memory/memory.failcnt":            "0\n",
		"memory/memory.stat":               "cache 1000\nrss 500000000\ntotal_rss 500000000\ntotal_inactive_file 4096\n",
		"pids/pids.current":                "7\n",
		"pids/pids.max":                    "max\n",
	}
	for f, v := range files {
		c, name, _ := strings.Cut(f, "/")
		if writeFileErr := os.WriteFile(filepath.Join(h.V1[c], "kubepods/pod1/vm", name), []byte(v), 0o644); writeFileErr != nil {
			t.Fatal(writeFileErr)
		}
	}
	s, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if s.Version != 1 || s.CPUUsageNs != 3e9 || s.CPUUserNs != 2e9 || s.CPUSystemNs != 1e9 || s.CPU["nr_throttled"] != 2 ||
		s.MemoryUsage != 600000000 || s.MemoryMaxUsage != 700000000 || s.Memory["total_rss"] != 500000000 ||
		s.Memory["total_inactive_file"] != 4096 || s.PidsCurrent != 7 || s.PidsLimit != math.MaxUint64 {
		t.Errorf("Stats = %+v", s)
	}
	// A file missing is an error naming the group, not zeros.
	os.Remove(filepath.Join(h.V1["memory"], "kubepods/pod1/vm/memory.stat"))
	if _, err := g.Stats(); err == nil || !strings.Contains(err.Error(), "/kubepods/pod1/vm") {
		t.Errorf("Stats without memory.stat: %v, want an error naming the group", err)
	}
}

func TestV2FakeTree(t *testing.T) {
	root := t.TempDir()
	h := Hierarchies{Unified: root, fake: true}
	if err := os.MkdirAll(filepath.Join(root, "kubepods"), 0o755); err != nil {
		t.Fatal(err)
	}
	g, err := h.Group("/kubepods/pod1/vm")
	if err != nil {
		t.Fatal(err)
	}
	if dirs := g.Dirs(); len(dirs) != 1 || dirs[0] != filepath.Join(root, "kubepods/pod1/vm") {
		t.Errorf("Dirs = %q", dirs)
	}
	created, err := g.Create()
	if err != nil || !created {
		t.Fatalf("Create: %v, %v", created, err)
	}
	// Each ancestor delegates memory, cpu and pids; the leaf holds QEMU
	// and enables nothing (no internal processes).
	for _, d := range []string{"", "kubepods", "kubepods/pod1"} {
		b, readFileErr := os.ReadFile(filepath.Join(root, d, "cgroup.subtree_control"))
		if readFileErr != nil || strings.TrimSpace(string(b)) != "+memory +cpu +pids" {
			t.Errorf("%s/cgroup.subtree_control = %q, %v", d, b, readFileErr)
		}
	}
	if _, err = os.Stat(filepath.Join(root, "kubepods/pod1/vm/cgroup.subtree_control")); err == nil {
		t.Error("the leaf's subtree_control was written")
	}
	if again, createErr := g.Create(); createErr != nil || again {
		t.Errorf("second Create: created %v, %v", again, createErr)
	}
	if err = g.Join(77); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "kubepods/pod1/vm/cgroup.procs")); string(b) != "77\n" {
		t.Errorf("cgroup.procs = %q", b)
	}
	files := map[string]string{
		"cpu.stat":       "usage_usec 5000\nuser_usec 3000\nsystem_usec 2000\nnr_periods 0\n",
		"memory.current": "800000000\n",
		"memory.max":     "max\n",
		"memory.stat":    "anon 700000000\nfile 1000\ninactive_file 500\npgfault 9\n",
		"memory.events":  "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n",
		"pids.current":   "12\n",
		"pids.max":       "1000\n",
	}
	for f, v := range files {
		if writeFileErr := os.WriteFile(filepath.Join(root, "kubepods/pod1/vm", f), []byte(v), 0o644); writeFileErr != nil {
			t.Fatal(writeFileErr)
		}
	}
	s, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if s.Version != 2 || s.CPUUsageNs != 5e6 || s.CPUUserNs != 3e6 || s.CPUSystemNs != 2e6 || s.MemoryUsage != 8e8 ||
		s.MemoryLimit != math.MaxUint64 || s.Memory["anon"] != 7e8 || s.MemoryEvents["oom_kill"] != 1 || s.MemoryFailcnt != 3 ||
		s.PidsCurrent != 12 || s.PidsLimit != 1000 {
		t.Errorf("Stats = %+v", s)
	}
}

// TestV1Real moves a real process into a fresh cgroup of this host (root,
// cgroup v1), reads its statistics and removes the group after the
// process ends.
func TestV1Real(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create cgroups")
	}
	h, err := Detect()
	if err != nil {
		t.Skip(err)
	}
	if h.Version() != 1 {
		t.Skip("host runs cgroup v2; the fake tree covers it")
	}
	parent := "/kvm-shim-unit-" + strconv.Itoa(os.Getpid())
	g, err := h.Group(parent + "/vm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = g.Remove()
		pg, _ := h.Group(parent)
		_ = pg.Remove()
	})
	if created, createErr := g.Create(); createErr != nil || !created {
		t.Fatalf("Create: %v, %v", created, createErr)
	}
	// The shell waits for a line, then works (charged after the move) and
	// becomes sleep: one process in the group throughout.
	cmd := exec.Command("sh", "-c", "read go; i=0; while [ $i -lt 20000 ]; do i=$((i+1)); v=\"$v$i\"; done; exec sleep 30")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err = cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := false
	defer func() {
		if !done {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	if err = g.Join(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if _, err = stdin.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"memory", "cpu", "cpuacct", "pids"} {
		if h.V1[c] == "" {
			continue
		}
		if !strings.Contains(string(b), ":"+c+":"+g.Path+"\n") && !strings.Contains(string(b), ","+c+":"+g.Path+"\n") &&
			!strings.Contains(string(b), ":"+c+",") {
			t.Errorf("/proc/%d/cgroup has no %s:%s:\n%s", cmd.Process.Pid, c, g.Path, b)
		}
	}
	if pids, procsErr := g.Procs(); procsErr != nil || len(pids) != 1 || pids[0] != cmd.Process.Pid {
		t.Errorf("Procs = %v, %v; want [%d]", pids, procsErr, cmd.Process.Pid)
	}
	var s Stats
	for end := time.Now().Add(20 * time.Second); ; {
		if s, err = g.Stats(); err != nil {
			t.Fatal(err)
		}
		if exe, _ := os.Readlink("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/exe"); strings.HasSuffix(exe, "sleep") || time.Now().After(end) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if s.MemoryUsage == 0 || s.CPUUsageNs == 0 || s.PidsCurrent != 1 {
		t.Errorf("Stats of a shell that worked after joining: %+v", s)
	}
	if err := g.Remove(); err == nil {
		t.Error("Remove of a cgroup with a live process succeeded")
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	done = true
	if err := g.Remove(); err != nil {
		t.Fatal(err)
	}
	for _, d := range g.Dirs() {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s left after Remove: %v", d, err)
		}
	}
}

// OOMKills reads the kill count from v1 memory.oom_control and v2
// memory.events, and names the group when the file is missing.
func TestOOMKills(t *testing.T) {
	v1 := fakeV1(t)
	v2 := Hierarchies{Unified: t.TempDir(), fake: true}
	for _, c := range []struct {
		h          Hierarchies
		file, text string
	}{
		{v1, filepath.Join(v1.V1["memory"], "pod/vm", "memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"},
		{v2, filepath.Join(v2.Unified, "pod/vm", "memory.events"), "low 0\nhigh 0\nmax 7\noom 2\noom_kill 3\noom_group_kill 0\n"},
	} {
		g, err := c.h.Group("/pod/vm")
		if err != nil {
			t.Fatal(err)
		}
		if _, err = g.OOMKills(); err == nil || !strings.Contains(err.Error(), "/pod/vm") {
			t.Errorf("v%d without the file: %v, want an error naming the group", c.h.Version(), err)
		}
		if err = os.MkdirAll(filepath.Dir(c.file), 0o755); err != nil {
			t.Fatal(err)
		}
		if err = os.WriteFile(c.file, []byte(c.text), 0o644); err != nil {
			t.Fatal(err)
		}
		if n, err := g.OOMKills(); err != nil || n != 3 {
			t.Errorf("v%d: %d kills, %v; want 3", c.h.Version(), n, err)
		}
	}
}

// MemoryLimit reads a pod's limit on v1 and v2; no limit, "max", the v1
// page counter's maximum and a missing group are no limit.
func TestMemoryLimit(t *testing.T) {
	v1 := fakeV1(t)
	v2 := Hierarchies{Unified: t.TempDir(), fake: true}
	for _, c := range []struct {
		h      Hierarchies
		file   string
		text   string
		want   uint64
		wantOK bool
	}{
		{v1, filepath.Join(v1.V1["memory"], "pod", "memory.limit_in_bytes"), "419430400\n", 400 << 20, true},
		{v1, filepath.Join(v1.V1["memory"], "pod", "memory.limit_in_bytes"), "9223372036854771712\n", 0, false},
		{v2, filepath.Join(v2.Unified, "pod", "memory.max"), "419430400\n", 400 << 20, true},
		{v2, filepath.Join(v2.Unified, "pod", "memory.max"), "max\n", 0, false},
	} {
		_ = os.RemoveAll(filepath.Dir(c.file))
		if n, ok, err := c.h.MemoryLimit("/pod"); err != nil || ok || n != 0 {
			t.Errorf("v%d, no group: %d %v %v, want no limit", c.h.Version(), n, ok, err)
		}
		if err := os.MkdirAll(filepath.Dir(c.file), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(c.file, []byte(c.text), 0o644); err != nil {
			t.Fatal(err)
		}
		if n, ok, err := c.h.MemoryLimit("/pod"); err != nil || ok != c.wantOK || n != c.want && c.wantOK {
			t.Errorf("v%d %q: %d %v %v, want %d %v", c.h.Version(), c.text, n, ok, err, c.want, c.wantOK)
		}
	}
	if _, _, err := v1.MemoryLimit("/../x"); err == nil {
		t.Error("a path leaving the tree was read")
	}
}
