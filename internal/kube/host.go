package kube

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// CgroupRoot is the first node's kubelet cgroupRoot: the node's pods live
// below it in each cgroup v1 hierarchy, apart from anything else on the
// host (the integration suite's CRI pods use /kubepods). Further nodes
// name their own (Node.CgroupRoot).
const CgroupRoot = "/kvm-shim-e2e"

const cgroupFS = "/sys/fs/cgroup"

// CgroupDirs lists a cgroup root in each mounted cgroup v1 hierarchy
// that has it: empty once the root is gone everywhere.
func CgroupDirs(root string) []string {
	var there []string
	for _, d := range cgroupDirs(root) {
		if _, err := os.Stat(d); err == nil {
			there = append(there, d)
		}
	}
	return there
}

// cgroupDirs lists root in each mounted hierarchy.
func cgroupDirs(root string) []string {
	entries, _ := os.ReadDir(cgroupFS)
	var dirs []string
	for _, e := range entries {
		h := filepath.Join(cgroupFS, e.Name())
		if _, err := os.Stat(filepath.Join(h, "cgroup.procs")); err == nil {
			dirs = append(dirs, filepath.Join(h, root))
		}
	}
	return dirs
}

// makeCgroupRoot creates a kubelet's cgroup root in every hierarchy
// (kubelet requires it to exist), with the root's CPUs and memory nodes in
// cpuset.
func makeCgroupRoot(root string) error {
	for _, d := range cgroupDirs(root) {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("cgroup root: %w", err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			b, err := os.ReadFile(filepath.Join(filepath.Dir(d), f))
			if err != nil {
				continue // not the cpuset hierarchy
			}
			if err := os.WriteFile(filepath.Join(d, f), b, 0o644); err != nil {
				return fmt.Errorf("cgroup root %s: %w", f, err)
			}
		}
	}
	return nil
}

// removeCgroupRoot removes a kubelet's cgroup root and what kubelet made
// below it, deepest first; cgroups of processes that just exited take a
// moment to go, so it tries for a few seconds.
func removeCgroupRoot(root string) error {
	var left []string
	for try := 0; try < 20; try++ {
		left = nil
		for _, dir := range cgroupDirs(root) {
			var dirs []string
			_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
			sort.Sort(sort.Reverse(sort.StringSlice(dirs)))
			for _, d := range dirs {
				if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
					left = append(left, d)
				}
			}
		}
		if len(left) == 0 {
			return nil
		}
		time.Sleep(250 * time.Millisecond)
	}
	return fmt.Errorf("cgroups left below %s: %s", root, strings.Join(left, ", "))
}

// kubeletChains are the iptables chains kubelet makes and leaves when it
// stops, by table (kube-proxy --cleanup removes kube-proxy's own).
var kubeletChains = map[string][]string{
	"filter": {"KUBE-FIREWALL", "KUBE-KUBELET-CANARY"},
	"nat":    {"KUBE-KUBELET-CANARY"},
	"mangle": {"KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"},
}

// removeKubeletChains removes kubelet's chains, and the jumps to
// KUBE-FIREWALL from INPUT and OUTPUT, from iptables and ip6tables. A
// chain that is not there is no error.
func removeKubeletChains() error {
	var errs []error
	for _, bin := range []string{"iptables", "ip6tables"} {
		if _, err := exec.LookPath(bin); err != nil {
			continue
		}
		ipt := func(args ...string) error {
			out, err := exec.Command(bin, append([]string{"-w"}, args...)...).CombinedOutput()
			if err != nil {
				return fmt.Errorf("%s %s: %v: %s", bin, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
			}
			return nil
		}
		exists := func(table, chain string) bool { return ipt("-t", table, "-S", chain) == nil }
		if exists("filter", "KUBE-FIREWALL") {
			for _, from := range []string{"INPUT", "OUTPUT"} {
				for ipt("-t", "filter", "-D", from, "-j", "KUBE-FIREWALL") == nil {
				}
			}
		}
		for table, chains := range kubeletChains {
			for _, chain := range chains {
				if !exists(table, chain) {
					continue
				}
				if err := ipt("-t", table, "-F", chain); err != nil {
					errs = append(errs, err)
				} else if err := ipt("-t", table, "-X", chain); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	return errors.Join(errs...)
}

// kubeletSysctls are the kernel settings kubelet sets at start when
// protectKernelDefaults is off (pkg/kubelet/cm's setupKernelTunables).
var kubeletSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom",
	"kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

// saveSysctls reads the kernel settings kubelet changes, for
// restoreSysctls: the host is shared, and kubelet's panic_on_oops=1 would
// turn any later oops on it into a reboot.
func saveSysctls() map[string]string {
	saved := map[string]string{}
	for _, k := range kubeletSysctls {
		if b, err := os.ReadFile(filepath.Join("/proc/sys", k)); err == nil {
			saved[k] = strings.TrimSpace(string(b))
		}
	}
	return saved
}

func restoreSysctls(saved map[string]string) error {
	var errs []error
	for k, v := range saved {
		if err := os.WriteFile(filepath.Join("/proc/sys", k), []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restore sysctl %s: %w", k, err))
		}
	}
	return errors.Join(errs...)
}
