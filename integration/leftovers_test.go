//go:build integration

package integration

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
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
// this containerd is deleted. It is strict on purpose; testenv's Leftovers
// checks the first seven:
//
//   - no containers in the default and k8s.io namespaces (ctr containers ls);
//   - no task bundle directory under <state>/io.containerd.runtime.v2.task/<ns>/;
//   - no mount point anywhere under this containerd's root, state or the
//     shim's state_dir (its mountinfo: in its own mount namespace if it has
//     one);
//   - the shim's state_dir holds nothing but its empty top-level directories
//     (testenv.StateDirLeftovers): no per-VM or per-pod directory, no file,
//     socket or link at any depth;
//   - no libvirt domain that belongs to this containerd's shim (its XML
//     names the shim's state_dir; other people's VMs on the same libvirtd
//     are not ours to judge);
//   - no pod IP still reserved in the private CNI network's host-local store
//     (CNI DEL ran for every pod);
//   - no containerd-shim-* process started with -address of this containerd;
//   - no shim socket for the given ids under /run/containerd/s;
//   - no NUMA reservation of this containerd's domains (isOwnDomain) in the
//     shim's numa_state_file (the file and its lock stay: they are the
//     node's store, shared by all shims);
//   - no host identity of this containerd's domains in the suite's
//     vm_id_state_file;
//   - no process (QEMU, or kvm-qemu-wrapper before it execs QEMU) whose
//     command line names a path under the shim's state_dir;
//   - no network descriptor socket under netfd's socket dir for a domain
//     of this containerd (isOwnDomain);
//   - no runc container (runc list under runc's default root, where the
//     shim's embedded runc task service makes plain containers and
//     pauses) whose bundle lies in this containerd's state dir.
func (c *containerd) leftovers(ids []shimID) []string {
	found := c.Leftovers(context.Background())
	for _, f := range found {
		if d, ok := testenv.LeftoverDomain(f); ok {
			c.noteDomains(d)
		}
	}
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
	if held, err := testenv.HostIDs(c.suite.idStateFile); err != nil {
		found = append(found, err.Error())
	} else {
		for o, id := range held {
			if domain, _, _ := strings.Cut(o, "/"); c.isOwnDomain(domain, ids) {
				found = append(found, fmt.Sprintf("host id %d of %s still allocated in %s", id, o, c.suite.idStateFile))
			}
		}
	}
	for _, p := range c.vmProcesses() {
		found = append(found, fmt.Sprintf("VM process %d: %.160s...", p.Pid, p.Cmdline))
	}
	for _, sock := range c.ownNetfdSockets(ids) {
		found = append(found, "network descriptor socket "+sock)
	}
	found = append(found, c.runcLeftovers()...)
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

// ownDomains lists this containerd's libvirt domains (testenv's Domains)
// and remembers their names for isOwnDomain.
func (c *containerd) ownDomains() ([]string, error) {
	doms, err := c.Domains()
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
// was this containerd's: one it was seen to own, one of a pod in this
// flavour's CRI pod namespace (kvm-<pod namespace>-..., podNamespace), or
// one of a container among ids (kvm-<namespace>-<id>-<hash>,
// shim/naming.go). Other people's VMs on this host, and the other
// flavours', leave traces in the same places; they are not ours to judge.
func (c *containerd) isOwnDomain(domain string, ids []shimID) bool {
	c.seenMu.Lock()
	defer c.seenMu.Unlock()
	own := c.seenDomains[domain] || strings.HasPrefix(domain, "kvm-"+c.podNamespace()+"-")
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

func virsh(args ...string) (string, error) {
	out, err := exec.Command("virsh", append([]string{"-c", "qemu:///system"}, args...)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("virsh %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// vmProcesses finds the processes of this containerd's VMs: QEMU (and
// kvm-qemu-wrapper before it execs QEMU, which keeps the arguments) names
// the VM's disk, kernel and console under the shim's state_dir.
func (c *containerd) vmProcesses() []testenv.Process {
	return testenv.ProcessesMatching(func(args []string) bool {
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
func domainProcesses(domain string) []testenv.Process {
	return testenv.ProcessesMatching(func(args []string) bool {
		for i, a := range args {
			if a == "-name" && i+1 < len(args) &&
				(args[i+1] == "guest="+domain || strings.HasPrefix(args[i+1], "guest="+domain+",")) {
				return true
			}
		}
		return false
	})
}

// forceCleanup removes, after a test, whatever it left in this containerd
// (testenv's ForceCleanup: CRI pods, tasks and containers in both
// namespaces, this shim's domains, shim processes, then the shim's
// state_dir entries and pod IPs), and what only this suite knows to be
// this containerd's (VM processes, NUMA reservations, descriptor
// sockets), and logs it: the next test starts as on a clean node, and the
// test's own assertNothingLeft is what fails a test. The domains it
// destroys are remembered as this containerd's (isOwnDomain).
func (c *containerd) forceCleanup(t *testing.T) {
	for _, r := range c.ForceCleanup(context.Background()) {
		if d, ok := testenv.LeftoverDomain(r); ok {
			c.noteDomains(d)
		}
		t.Logf("cleanup: removed %s", r)
	}
	for _, p := range c.vmProcesses() {
		_ = syscall.Kill(p.Pid, syscall.SIGKILL)
		t.Logf("cleanup: killed VM process %d: %.160s...", p.Pid, p.Cmdline)
	}
	if owners, _ := numaOwners(c.NUMAStateFile); slices.ContainsFunc(owners, func(o string) bool {
		domain, _, _ := strings.Cut(o, "/")
		return c.isOwnDomain(domain, nil)
	}) {
		// No shim of this containerd runs any more, and the file is
		// this containerd's alone: the next shim starts a new one.
		if err := os.Remove(c.NUMAStateFile); err != nil {
			t.Logf("cleanup: NUMA reservations %q: %v", owners, err)
		} else {
			t.Logf("cleanup: removed the NUMA reservations %q (%s)", owners, c.NUMAStateFile)
		}
	}
	for _, sock := range c.ownNetfdSockets(nil) {
		if err := os.Remove(sock); err == nil {
			t.Logf("cleanup: removed network descriptor socket %s", sock)
		}
	}
}

// cleanupAfter registers forceCleanup for the end of t.
func (c *containerd) cleanupAfter(t *testing.T) {
	t.Cleanup(func() { c.forceCleanup(t) })
}

// runcRoot is runc's default root as containerd's runc task code uses it,
// one directory per containerd namespace (pkg/process.RuncRoot).
const runcRoot = "/run/containerd/runc"

// runcLeftovers lists the runc containers of this containerd's tasks that
// are still there: both flavours and the host share runc's root, so a
// container counts when its bundle is in this containerd's state dir.
func (c *containerd) runcLeftovers() []string {
	var found []string
	for _, ns := range []string{nsDefault, nsCRI} {
		root := filepath.Join(runcRoot, ns)
		if _, err := os.Stat(root); errors.Is(err, os.ErrNotExist) {
			continue
		}
		out, err := exec.Command("runc", "--root", root, "list", "--format", "json").Output()
		if err != nil {
			found = append(found, fmt.Sprintf("runc list --root %s: %v", root, err))
			continue
		}
		var list []struct {
			ID     string `json:"id"`
			Pid    int    `json:"pid"`
			Status string `json:"status"`
			Bundle string `json:"bundle"`
		}
		if err := json.Unmarshal(out, &list); err != nil {
			found = append(found, fmt.Sprintf("runc list --root %s: %v: %s", root, err, out))
			continue
		}
		for _, ct := range list {
			if strings.HasPrefix(ct.Bundle, c.State+"/") {
				found = append(found, fmt.Sprintf("runc container %s (%s, pid %d) in %s", ct.ID, ct.Status, ct.Pid, root))
			}
		}
	}
	return found
}
