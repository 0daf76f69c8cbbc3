//go:build integration

package integration

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// shimSocketDir is where the shim library (containerd v1.7 runtime/v2/shim)
// puts shim sockets, whatever containerd's state dir is.
const shimSocketDir = "/run/containerd/s"

// netfdSocketDir is where the kvm shim serves each networked VM's TAP
// descriptors to its emulator wrapper, as <domain>.sock (netfd.SocketDir;
// fixed, whatever the state_dir).
const netfdSocketDir = "/run/containerd-shim-kvm-v1/netfd"

// leftoverTimeout bounds how long "nothing left" may take to become true
// after the last delete: shims exit asynchronously.
const leftoverTimeout = 15 * time.Second

// shimID names one shim instance: the id it was started for (the container
// id for ctr, the sandbox id for a CRI pod) in a namespace.
type shimID struct{ ns, id string }

// assertNothingLeft fails t unless, within leftoverTimeout, everything below
// holds for this containerd (see leftovers). ids are the containers and
// sandboxes the test created.
func assertNothingLeft(t *testing.T, c *containerd, ids ...shimID) {
	t.Helper()
	var last []string
	err := poll(leftoverTimeout, func() (bool, string) {
		last = c.leftovers(ids)
		return len(last) == 0, strings.Join(last, "; ")
	})
	if err != nil {
		t.Errorf("left behind after delete:\n  %s", strings.Join(last, "\n  "))
	}
}

// leftovers lists what should not exist once every container and sandbox of
// this containerd is deleted. It is strict on purpose:
//
//   - no containers in the default and k8s.io namespaces (ctr containers ls);
//   - no task bundle directory under <state>/io.containerd.runtime.v2.task/<ns>/;
//   - no mount point anywhere under this containerd's root, state or the
//     shim's state_dir (/proc/self/mountinfo);
//   - the shim's state_dir holds nothing but its empty top-level directories
//     (shimStateDirs): no per-VM or per-pod directory, no file, socket or
//     link at any depth;
//   - no libvirt domain named kvm-* that belongs to this containerd's shim
//     (its XML names the shim's state_dir; other people's VMs on the same
//     libvirtd are not ours to judge);
//   - no pod IP still reserved in the private CNI network's host-local store
//     (CNI DEL ran for every pod);
//   - no containerd-shim-* process started with -address of this containerd;
//   - no shim socket for the given ids under /run/containerd/s;
//   - no NUMA reservation of this containerd's domains (isOwnDomain) in the
//     shim's numa_state_file (the file and its lock stay: they are the
//     node's store, shared by all shims);
//   - no process (QEMU, or kvm-qemu-wrapper before it execs QEMU) whose
//     command line names a path under the shim's state_dir;
//   - no network descriptor socket under netfd's socket dir for a domain
//     of this containerd (isOwnDomain).
func (c *containerd) leftovers(ids []shimID) []string {
	var found []string
	for _, ns := range []string{nsDefault, nsCRI} {
		r := c.ctr(ns, "containers", "ls", "-q")
		if r.Err != nil {
			found = append(found, r.String())
		} else if s := strings.Fields(r.Stdout); len(s) > 0 {
			found = append(found, fmt.Sprintf("containers in namespace %s: %v", ns, s))
		}
		bundles := filepath.Join(c.State, "io.containerd.runtime.v2.task", ns)
		if names := testenv.DirNames(bundles); len(names) > 0 {
			found = append(found, fmt.Sprintf("task bundles in %s: %v", bundles, names))
		}
	}
	for _, m := range c.Mounts(c.Dir) {
		found = append(found, "mount "+m)
	}
	found = append(found, stateDirLeftovers(c.ShimStateDir)...)
	if owners, err := numaOwners(c.NUMAStateFile); err != nil {
		found = append(found, err.Error())
	} else {
		for _, o := range owners {
			// A shim that starts adopts the placements of every live
			// domain on the node, other people's too.
			if domain, _, _ := strings.Cut(o, "/"); c.isOwnDomain(domain, ids) {
				found = append(found, fmt.Sprintf("NUMA reservation of %s in %s", o, c.NUMAStateFile))
			}
		}
	}
	ipam := filepath.Join(c.IPAMDir, cniNetwork)
	for _, name := range testenv.DirNames(ipam) {
		if name != "lock" && !strings.HasPrefix(name, "last_reserved_ip.") {
			found = append(found, "pod IP still reserved: "+filepath.Join(ipam, name))
		}
	}
	if doms, err := c.ownDomains(); err != nil {
		found = append(found, err.Error())
	} else {
		for _, d := range doms {
			found = append(found, "libvirt domain "+d)
		}
	}
	for _, p := range c.shimProcesses() {
		found = append(found, fmt.Sprintf("shim process %d: %s", p.pid, p.cmdline))
	}
	for _, p := range c.vmProcesses() {
		found = append(found, fmt.Sprintf("VM process %d: %.160s...", p.pid, p.cmdline))
	}
	for _, sock := range c.ownNetfdSockets(ids) {
		found = append(found, "network descriptor socket "+sock)
	}
	for _, id := range ids {
		sock := shimSocketPath(c.Address, id)
		if _, err := os.Lstat(sock); err == nil {
			found = append(found, fmt.Sprintf("shim socket %s (namespace %s, id %s)", sock, id.ns, id.id))
		}
	}
	sort.Strings(found)
	return found
}

// shimSocketPath is where the shim library puts the socket of the shim
// started for id: sha256 of containerd's address, namespace and id.
func shimSocketPath(address string, id shimID) string {
	sum := sha256.Sum256([]byte(filepath.Join(address, id.ns, id.id)))
	return filepath.Join(shimSocketDir, fmt.Sprintf("%x", sum))
}

// freshShimState removes the shim's state_dir, as on a node where the shim
// never ran. Only safe with nothing running, so it checks that first. At the
// end of t it leaves an empty state_dir searchable by QEMU, so that what t
// did to it cannot fail the tests after it.
func (c *containerd) freshShimState(t *testing.T) {
	t.Helper()
	if left := c.leftovers(nil); len(left) > 0 {
		t.Fatalf("cannot reset the shim state_dir, things are left:\n  %s", strings.Join(left, "\n  "))
	}
	if err := os.RemoveAll(c.ShimStateDir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if len(c.leftovers(nil)) == 0 {
			_ = os.RemoveAll(c.ShimStateDir)
			_ = os.Mkdir(c.ShimStateDir, 0o711)
		}
	})
}

// shimStateDirs are the top-level directories the shim keeps in its
// state_dir for its whole life (shim/naming.go layout): vms/<domain>/ and
// pods/<pod uid>/ live below them and must be gone after delete.
var shimStateDirs = map[string]bool{"vms": true, "pods": true}

// stateDirLeftovers lists what the shim's state_dir holds beyond its empty
// top-level directories.
func stateDirLeftovers(dir string) []string {
	var found []string
	for _, name := range testenv.DirNames(dir) {
		path := filepath.Join(dir, name)
		fi, err := os.Lstat(path)
		switch {
		case err != nil:
			found = append(found, err.Error())
		case !shimStateDirs[name] || !fi.IsDir():
			found = append(found, "shim state "+path)
		default:
			for _, sub := range testenv.DirNames(path) {
				found = append(found, "shim state "+filepath.Join(path, sub))
			}
		}
	}
	return found
}

// numaOwners lists the owners (<domain>/<container id>) of the
// reservations in a NUMA state file; a missing file has none.
func numaOwners(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var st struct {
		Reservations []struct {
			Owner string `json:"owner"`
		} `json:"reservations"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("parse %s: %v\n%s", path, err, b)
	}
	owners := make([]string, len(st.Reservations))
	for i, r := range st.Reservations {
		owners[i] = r.Owner
	}
	return owners, nil
}

// ownDomains lists this containerd's libvirt domains (see the function
// ownDomains) and remembers their names for ownNetfdSockets.
func (c *containerd) ownDomains() ([]string, error) {
	doms, err := ownDomains(c.ShimStateDir)
	c.noteDomains(doms...)
	return doms, err
}

// noteDomains remembers domain names as this containerd's.
func (c *containerd) noteDomains(names ...string) {
	c.seenMu.Lock()
	defer c.seenMu.Unlock()
	if c.seenDomains == nil {
		c.seenDomains = map[string]bool{}
	}
	for _, n := range names {
		c.seenDomains[n] = true
	}
}

// isOwnDomain tells, by its name alone, whether a domain that may be gone
// was this containerd's: one it was seen to own, one of a pod in the
// suite's CRI namespace (kvm-<pod namespace>-...), or one of a container
// among ids (kvm-<namespace>-<id>-<hash>, shim/naming.go). Other people's
// VMs on this host leave traces in the same places; they are not ours to
// judge.
func (c *containerd) isOwnDomain(domain string, ids []shimID) bool {
	c.seenMu.Lock()
	defer c.seenMu.Unlock()
	own := c.seenDomains[domain] || strings.HasPrefix(domain, "kvm-"+criPodNamespace+"-")
	for _, id := range ids {
		own = own || strings.HasPrefix(domain, "kvm-"+id.ns+"-"+id.id+"-")
	}
	return own
}

// ownNetfdSockets lists the sockets in netfdSocketDir of this containerd's
// domains (isOwnDomain).
func (c *containerd) ownNetfdSockets(ids []shimID) []string {
	var found []string
	for _, name := range testenv.DirNames(netfdSocketDir) {
		if domain, ok := strings.CutSuffix(name, ".sock"); ok && c.isOwnDomain(domain, ids) {
			found = append(found, filepath.Join(netfdSocketDir, name))
		}
	}
	return found
}

// ownDomains lists libvirt domains (running or not) named kvm-* whose XML
// mentions dir: the shim puts each VM's disk overlay and console under its
// state_dir, so this tells our VMs from anybody else's.
func ownDomains(dir string) ([]string, error) {
	out, err := virsh("list", "--all", "--name")
	if err != nil {
		return nil, err
	}
	var own []string
	for _, name := range strings.Fields(out) {
		if !strings.HasPrefix(name, "kvm-") {
			continue
		}
		// A domain undefined since the listing is gone: not a leftover.
		if xml, err := virsh("dumpxml", name); err == nil && strings.Contains(xml, dir+"/") {
			own = append(own, name)
		}
	}
	return own, nil
}

func virsh(args ...string) (string, error) {
	out, err := exec.Command("virsh", append([]string{"-c", "qemu:///system"}, args...)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("virsh %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

type process struct {
	pid     int
	cmdline string
}

// shimProcesses finds containerd-shim-* processes serving this containerd,
// recognised by their -address argument.
func (c *containerd) shimProcesses() []process {
	return processesMatching(func(args []string) bool {
		if !strings.HasPrefix(filepath.Base(args[0]), "containerd-shim-") {
			return false
		}
		for i, a := range args {
			if (a == "-address" || a == "--address") && i+1 < len(args) && args[i+1] == c.Address ||
				a == "-address="+c.Address || a == "--address="+c.Address {
				return true
			}
		}
		return false
	})
}

// vmProcesses finds the processes of this containerd's VMs: QEMU (and
// kvm-qemu-wrapper before it execs QEMU, which keeps the arguments) names
// the VM's disk, kernel and console under the shim's state_dir.
func (c *containerd) vmProcesses() []process {
	return processesMatching(func(args []string) bool {
		for _, a := range args {
			if strings.Contains(a, c.ShimStateDir+"/") {
				return !strings.HasPrefix(filepath.Base(args[0]), "containerd")
			}
		}
		return false
	})
}

// domainProcesses finds the processes libvirt runs for domain: QEMU, or the
// wrapper before it execs QEMU (libvirt names the domain with -name
// guest=<domain>,...).
func domainProcesses(domain string) []process {
	return processesMatching(func(args []string) bool {
		for i, a := range args {
			if a == "-name" && i+1 < len(args) &&
				(args[i+1] == "guest="+domain || strings.HasPrefix(args[i+1], "guest="+domain+",")) {
				return true
			}
		}
		return false
	})
}

// processesMatching lists live processes whose argv satisfies match.
func processesMatching(match func(args []string) bool) []process {
	entries, _ := os.ReadDir("/proc")
	var procs []process
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
			procs = append(procs, process{pid, strings.Join(args, " ")})
		}
	}
	return procs
}

// forceCleanup removes, after a test, whatever it left in this containerd:
// tasks and containers in both namespaces, CRI pods, domains that belong to
// this run, and shim processes. It logs what it had to remove; the test's own
// assertNothingLeft is what fails a test.
func (c *containerd) forceCleanup(t *testing.T) {
	c.criCleanup(t)
	for _, ns := range []string{nsDefault, nsCRI} {
		r := c.ctr(ns, "containers", "ls", "-q")
		for _, id := range strings.Fields(r.Stdout) {
			t.Logf("cleanup: removing container %s/%s", ns, id)
			c.ctr(ns, "task", "kill", "-s", "KILL", id)
			c.ctr(ns, "task", "delete", "-f", id)
			if r := c.ctr(ns, "containers", "delete", id); r.Err != nil {
				t.Logf("cleanup: %v", r)
			}
		}
	}
	doms, _ := c.ownDomains()
	for _, d := range doms {
		t.Logf("cleanup: destroying libvirt domain %s", d)
		_, _ = virsh("destroy", d)
		_, _ = virsh("undefine", d)
	}
	// Shims exit on their own once their last task is deleted; give them the
	// same time the leftover check gives them before killing.
	_ = poll(leftoverTimeout, func() (bool, string) { return len(c.shimProcesses()) == 0, "" })
	for _, p := range c.shimProcesses() {
		t.Logf("cleanup: killing shim process %d: %s", p.pid, p.cmdline)
		_ = syscall.Kill(p.pid, syscall.SIGKILL)
	}
}

// cleanupAfter registers forceCleanup for the end of t.
func (c *containerd) cleanupAfter(t *testing.T) {
	t.Cleanup(func() { c.forceCleanup(t) })
}
