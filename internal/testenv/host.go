package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/procfs"

	"github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"
)

// Process is a process found in /proc.
type Process struct {
	Pid     int
	Cmdline string
}

// ProcessesMatching lists the live processes whose argv (never empty)
// satisfies match.
func ProcessesMatching(match func(args []string) bool) []Process {
	entries, _ := os.ReadDir("/proc")
	var procs []Process
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(raw) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if match(args) {
			procs = append(procs, Process{Pid: pid, Cmdline: strings.Join(args, " ")})
		}
	}
	return procs
}

// ShimProcesses lists the containerd-shim-* processes that serve this
// daemon, recognised by their -address argument.
func (c *Containerd) ShimProcesses() []Process {
	return ProcessesMatching(func(args []string) bool { return isShimOf(args, c.Address) })
}

// isShimOf reports whether args are a containerd shim's serving address.
func isShimOf(args []string, address string) bool {
	if len(args) == 0 || !strings.HasPrefix(filepath.Base(args[0]), "containerd-shim-") {
		return false
	}
	for i, a := range args {
		switch {
		case (a == "-address" || a == "--address") && i+1 < len(args) && args[i+1] == address,
			a == "-address="+address, a == "--address="+address:
			return true
		}
	}
	return false
}

// MountsUnder lists mount points at or below dir, deepest first.
func MountsUnder(dir string) []string { return MountsUnderIn("/proc/self/mountinfo", dir) }

// MountsUnderIn is MountsUnder for the mount namespace a mountinfo file
// describes (/proc/<pid>/mountinfo of a process in another namespace).
func MountsUnderIn(mountinfo, dir string) []string {
	f, err := os.Open(mountinfo)
	if err != nil {
		return []string{err.Error()}
	}
	defer f.Close()
	var mounts []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := procfs.UnescapeMountinfo(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			mounts = append(mounts, mp)
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(mounts)))
	return mounts
}

// Mounts lists the mount points at or below dir that the daemon and its
// shims see: in the daemon's own mount namespace while it runs with
// Options.MountSetup, else in this process's.
func (c *Containerd) Mounts(dir string) []string {
	if c.MountSetup != "" && c.Pid() != 0 && !c.Exited() {
		return MountsUnderIn(fmt.Sprintf("/proc/%d/mountinfo", c.Pid()), dir)
	}
	return MountsUnder(dir)
}

// UnmountAll unmounts everything at or below dir, deepest first.
func UnmountAll(dir string) error {
	var errs []error
	for _, m := range MountsUnder(dir) {
		if err := syscall.Unmount(m, 0); err != nil {
			if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil {
				errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
			}
		}
	}
	return errors.Join(errs...)
}

// RemoveTree unmounts everything at or below path (UnmountAll), then
// removes it; a mount that stays keeps it.
func RemoveTree(path string) error {
	if err := UnmountAll(path); err != nil {
		return err
	}
	return os.RemoveAll(path)
}

// ConnectLibvirt opens a go-libvirt connection to qemu:///system through
// libvirtd's local socket.
func ConnectLibvirt() (*libvirt.Libvirt, error) {
	l := libvirt.NewWithDialer(dialers.NewLocal())
	if err := l.ConnectToURI(libvirt.QEMUSystem); err != nil {
		return nil, fmt.Errorf("connect to libvirt qemu:///system: %w", err)
	}
	return l, nil
}

// DomainsMentioning lists the libvirt domains (running or not) whose XML
// contains dir followed by a slash: the shim puts every VM's console and
// disks below its state_dir, which tells this daemon's VMs from others'.
func DomainsMentioning(l *libvirt.Libvirt, dir string) ([]string, error) {
	doms, _, err := l.ConnectListAllDomains(1, 0)
	if err != nil {
		return nil, fmt.Errorf("list libvirt domains: %w", err)
	}
	var own []string
	for _, d := range doms {
		xml, err := l.DomainGetXMLDesc(d, 0)
		if err != nil {
			continue // gone since the listing
		}
		if strings.Contains(xml, dir+"/") {
			own = append(own, d.Name)
		}
	}
	sort.Strings(own)
	return own, nil
}

// RemoveDomainsMentioning destroys and undefines the domains whose XML
// names a path below dir (DomainsMentioning) and lists them as leftovers.
func RemoveDomainsMentioning(l *libvirt.Libvirt, dir string) ([]string, error) {
	doms, err := DomainsMentioning(l, dir)
	removed := make([]string, 0, len(doms))
	for _, name := range doms {
		removed = append(removed, leftoverDomain+name)
		if d, domainLookupByNameErr := l.DomainLookupByName(name); domainLookupByNameErr == nil {
			_ = l.DomainDestroy(d)
			_ = l.DomainUndefine(d)
		}
	}
	return removed, err
}

// Domains lists this daemon's libvirt domains: those that mention its
// shim's state_dir (DomainsMentioning).
func (c *Containerd) Domains() ([]string, error) {
	l, err := ConnectLibvirt()
	if err != nil {
		return nil, err
	}
	defer l.Disconnect()
	return DomainsMentioning(l, c.ShimStateDir)
}

// shimStateDirs are the top-level directories the kvm shim keeps in its
// state_dir for its whole life (shim/naming.go layout): vms/<domain>/ and
// pods/<pod uid>/ live below them and must be gone once everything is
// deleted.
var shimStateDirs = map[string]bool{"vms": true, "pods": true}

// StateDirLeftovers lists what the kvm shim's state_dir holds beyond its
// empty top-level directories: per-VM or per-pod directories, and any
// other file, socket or link.
func StateDirLeftovers(dir string) []string {
	paths, errs := stateDirEntries(dir)
	found := errs
	for _, p := range paths {
		found = append(found, "shim state "+p)
	}
	return found
}

// stateDirEntries lists the paths StateDirLeftovers reports, and the
// errors met reading them.
func stateDirEntries(dir string) (paths, errs []string) {
	for _, name := range DirNames(dir) {
		path := filepath.Join(dir, name)
		fi, err := os.Lstat(path)
		switch {
		case err != nil:
			errs = append(errs, err.Error())
		case !shimStateDirs[name] || !fi.IsDir():
			paths = append(paths, path)
		default:
			for _, sub := range DirNames(path) {
				paths = append(paths, filepath.Join(path, sub))
			}
		}
	}
	return paths, errs
}

// reservedIPs lists the host-local IPAM files of pod IPs still reserved
// in this daemon's CNI network.
func (c *Containerd) reservedIPs() []string {
	ipam := filepath.Join(c.IPAMDir, c.CNINetwork)
	var found []string
	for _, name := range DirNames(ipam) {
		if name != "lock" && !strings.HasPrefix(name, "last_reserved_ip.") {
			found = append(found, filepath.Join(ipam, name))
		}
	}
	return found
}

// leftoverDomain starts the Leftovers and ForceCleanup entry of a libvirt
// domain.
const leftoverDomain = "libvirt domain "

// LeftoverDomain returns the domain an entry of Leftovers or ForceCleanup
// reports, if it reports one.
func LeftoverDomain(entry string) (name string, ok bool) {
	return strings.CutPrefix(entry, leftoverDomain)
}

// Leftovers lists what should not exist once every container and pod of
// this daemon is deleted: containers, task bundles, mounts below Dir (as
// the daemon sees them), anything in the shim's state_dir beyond its empty
// top-level directories (StateDirLeftovers), libvirt domains of this shim,
// reserved pod IPs and shim processes.
func (c *Containerd) Leftovers(ctx context.Context) []string {
	var found []string
	for _, ns := range []string{NamespaceDefault, NamespaceCRI} {
		r := c.Ctr(ctx, ns, "containers", "ls", "-q")
		if r.Err != nil {
			found = append(found, r.String())
		} else if ids := strings.Fields(r.Stdout); len(ids) > 0 {
			found = append(found, fmt.Sprintf("containers in namespace %s: %v", ns, ids))
		}
		bundles := filepath.Join(c.State, "io.containerd.runtime.v2.task", ns)
		if names := DirNames(bundles); len(names) > 0 {
			found = append(found, fmt.Sprintf("task bundles in %s: %v", bundles, names))
		}
	}
	for _, m := range c.Mounts(c.Dir) {
		found = append(found, "mount "+m)
	}
	found = append(found, StateDirLeftovers(c.ShimStateDir)...)
	for _, f := range c.reservedIPs() {
		found = append(found, "pod IP still reserved: "+f)
	}
	doms, err := c.Domains()
	if err != nil {
		found = append(found, err.Error())
	}
	for _, d := range doms {
		found = append(found, leftoverDomain+d)
	}
	for _, p := range c.ShimProcesses() {
		found = append(found, fmt.Sprintf("shim process %d: %s", p.Pid, p.Cmdline))
	}
	sort.Strings(found)
	return found
}

// WaitNothingLeft polls Leftovers until it is empty or timeout passes (shims
// exit asynchronously after their last task is deleted); it returns what
// was still there.
func (c *Containerd) WaitNothingLeft(ctx context.Context, timeout time.Duration) []string {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last []string
	_ = Poll(ctx, 200*time.Millisecond, func() (bool, string) {
		last = c.Leftovers(context.WithoutCancel(ctx))
		return len(last) == 0, ""
	})
	return last
}

// ForceCleanup removes whatever is left in this daemon: CRI pods, tasks and
// containers in both namespaces, libvirt domains of this shim, and, after
// a grace period for them to exit, shim processes; then what no process
// will release any more (ClearState). It returns what it had to remove;
// an empty list means there was nothing.
func (c *Containerd) ForceCleanup(ctx context.Context) []string {
	var removed []string
	if cl, err := c.DialCRI(); err == nil {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		n, err := cl.RemoveAllPods(cctx)
		cancel()
		cl.Close()
		if n > 0 {
			removed = append(removed, fmt.Sprintf("%d CRI pod(s)", n))
		}
		if err != nil {
			removed = append(removed, err.Error())
		}
	}
	for _, ns := range []string{NamespaceDefault, NamespaceCRI} {
		r := c.Ctr(ctx, ns, "containers", "ls", "-q")
		for _, id := range strings.Fields(r.Stdout) {
			removed = append(removed, "container "+ns+"/"+id)
			c.Ctr(ctx, ns, "task", "kill", "-s", "KILL", id)
			c.Ctr(ctx, ns, "task", "delete", "-f", id)
			c.Ctr(ctx, ns, "containers", "delete", id)
		}
	}
	if l, err := ConnectLibvirt(); err == nil {
		doms, _ := RemoveDomainsMentioning(l, c.ShimStateDir)
		removed = append(removed, doms...)
		_ = l.Disconnect()
	}
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	_ = Poll(pctx, 200*time.Millisecond, func() (bool, string) { return len(c.ShimProcesses()) == 0, "" })
	cancel()
	for _, p := range c.ShimProcesses() {
		removed = append(removed, fmt.Sprintf("shim process %d: %s", p.Pid, p.Cmdline))
		_ = syscall.Kill(p.Pid, syscall.SIGKILL)
	}
	return append(removed, c.ClearState()...)
}

// ClearState removes, once no shim of this daemon runs, what a failed test
// left in the shim's state_dir (unmounting below each entry first) and the
// pod IPs it left reserved, so that the tests after it start as on a clean
// node: one failure stays one failing test. It returns what it removed,
// and what it could not.
func (c *Containerd) ClearState() []string {
	var removed []string
	paths, errs := stateDirEntries(c.ShimStateDir)
	removed = append(removed, errs...)
	for _, p := range paths {
		if err := RemoveTree(p); err != nil {
			removed = append(removed, fmt.Sprintf("shim state %s kept: %v", p, err))
			continue
		}
		removed = append(removed, "shim state "+p)
	}
	for _, f := range c.reservedIPs() {
		if err := os.Remove(f); err != nil {
			removed = append(removed, err.Error())
			continue
		}
		removed = append(removed, "pod IP reservation "+f)
	}
	return removed
}

// DirNames lists a directory; a missing directory is empty.
func DirNames(dir string) []string {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return []string{err.Error()}
	}
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name()
	}
	return names
}
