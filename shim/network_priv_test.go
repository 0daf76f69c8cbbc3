package shim

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kvm-shim/containerd-shim-kvm-v1/config"
	"github.com/kvm-shim/containerd-shim-kvm-v1/netfd"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

var netnsSeq int

// twoInterfaceNetns makes a network namespace with eth0 and net1 (veths
// whose peers live in the host namespace), each with an address, and
// removes it when t ends.
func twoInterfaceNetns(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2")
	}
	// Each call has its own names: a namespace's veths are freed
	// asynchronously after "ip netns del", so the next test must not reuse
	// them.
	netnsSeq++
	name := fmt.Sprintf("kvmshim-shim-%d-%d", os.Getpid(), netnsSeq)
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	for i, ifc := range []string{"eth0", "net1"} {
		peer := fmt.Sprintf("kvshp%d-%d-%d", os.Getpid()%100000, netnsSeq%100, i)
		run("link", "add", peer, "type", "veth", "peer", "name", ifc, "netns", name)
		t.Cleanup(func() { _ = exec.Command("ip", "link", "del", peer).Run() })
		run("-n", name, "addr", "add", fmt.Sprintf("10.%d.0.5/24", 70+i), "dev", ifc)
		run("-n", name, "link", "set", ifc, "up")
	}
	return filepath.Join("/run/netns", name)
}

// leftIn lists our TAPs and ingress qdiscs in the namespace.
func leftIn(t *testing.T, netns string) string {
	t.Helper()
	out, err := exec.Command("nsenter", "--net="+netns, "sh", "-c",
		"ip -o link show; for d in eth0 net1; do tc qdisc show dev $d ingress; done").CombinedOutput()
	if err != nil {
		t.Fatalf("inspect %s: %v: %s", netns, err, out)
	}
	var left []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, netfd.TAPPrefix) || strings.Contains(l, "qdisc ingress") {
			left = append(left, strings.TrimSpace(l))
		}
	}
	return strings.Join(left, "\n")
}

// planAndSetup plans the network of netns as a Create does (sandbox is
// what the sandbox saw; nil for none) and sets it up.
func planAndSetup(h *host, netns string, sandbox *netfd.PodNetwork, s netSetup) (netfd.PodNetwork, *netfd.Server, error) {
	ctx := context.Background()
	np, err := planNetwork(ctx, createRequest{netns: netns, podNet: sandbox, spec: &specs.Spec{}}, "vm")
	if err != nil {
		return netfd.PodNetwork{}, nil, err
	}
	srv, err := setupNetwork(ctx, h, np, s)
	return np.pod, srv, err
}

func testNetHost(t *testing.T) *host {
	return &host{cfg: config.Config{MaxNetQueues: 2, VNetHdr: true, QEMUBinary: "/usr/bin/qemu-system-x86_64"},
		accel: vm.AccelTCG, fdSocketDir: filepath.Join(t.TempDir(), "netfd")}
}

// Every pod interface gets its TAP and wiring, recorded before it is made;
// the rollback and the teardown from the record leave the namespace as
// CNI made it.
func TestSetupNetworkTwoInterfaces(t *testing.T) {
	netns := twoInterfaceNetns(t)
	h := testNetHost(t)
	var recorded *vmNetwork
	var undo rollback
	pn, srv, err := planAndSetup(h, netns, nil, netSetup{domain: "dom-two", key: "0123456789abcdef", vcpus: 4,
		id: vm.Identity{UID: uint32(h.qemuUID), GID: uint32(h.qemuGID)},
		record: func(n *vmNetwork) error {
			c := *n
			c.Links = append([]wiredLink(nil), n.Links...)
			recorded = &c
			return nil
		}, undo: &undo})
	if err != nil {
		t.Fatal(err)
	}
	if len(pn.Interfaces) != 2 || recorded == nil || len(recorded.Links) != 2 ||
		recorded.Links[0] != (wiredLink{PodIf: "eth0", TAP: "kvmtap01234567", CreatedQdisc: true}) ||
		recorded.Links[1] != (wiredLink{PodIf: "net1", TAP: "kvmtap012345671", CreatedQdisc: true}) {
		t.Fatalf("interfaces %+v, record %+v", pn.Interfaces, recorded)
	}
	left := leftIn(t, netns)
	for _, want := range []string{"kvmtap01234567:", "kvmtap012345671:"} {
		if !strings.Contains(left, want) {
			t.Errorf("after setup the namespace lacks %s:\n%s", want, left)
		}
	}
	if _, statErr := os.Stat(netfd.SocketPath(h.fdSocketDir, "dom-two")); statErr != nil {
		t.Errorf("descriptor socket: %v", statErr)
	}
	// The same network again is the same; one that changed is refused
	// before anything is made.
	var undo2 rollback
	other := pn
	other.Interfaces = pn.Interfaces[:1]
	_, _, err = planAndSetup(h, netns, &other, netSetup{domain: "dom-changed", key: "fedcba9876543210", vcpus: 1,
		id:     vm.Identity{UID: uint32(h.qemuUID), GID: uint32(h.qemuGID)},
		record: func(*vmNetwork) error { t.Error("a changed network was recorded"); return nil }, undo: &undo2})
	if !errdefs.IsFailedPrecondition(err) ||
		!strings.Contains(err.Error(), "changed since its sandbox") {
		t.Errorf("changed network: %v", err)
	}
	if len(undo2) != 0 {
		t.Errorf("a refused network left %d undo steps", len(undo2))
	}

	_ = srv
	undo.run()
	if left := leftIn(t, netns); left != "" {
		t.Errorf("left after the rollback:\n%s", left)
	}
	if _, err := os.Stat(netfd.SocketPath(h.fdSocketDir, "dom-two")); !os.IsNotExist(err) {
		t.Errorf("descriptor socket after the rollback: %v", err)
	}
	// The teardown from the record tolerates all of it being gone.
	if err := teardownNetwork(recorded); err != nil {
		t.Error(err)
	}
}

// A failure at the second interface takes back the first one's wiring
// and leaves another VM's redirect on the second alone.
func TestSetupNetworkFailsHalfway(t *testing.T) {
	netns := twoInterfaceNetns(t)
	h := testNetHost(t)
	// Another VM of the pod already carries net1.
	otherTAP := netfd.TAP{Name: "kvmtapother", Queues: 1, MTU: 1500}
	if err := netfd.CreateTAP(netns, otherTAP); err != nil {
		t.Fatal(err)
	}
	created, err := netfd.Wire(netns, "net1", otherTAP.Name)
	if err != nil {
		t.Fatal(err)
	}
	var undo rollback
	var recorded *vmNetwork
	_, _, err = planAndSetup(h, netns, nil, netSetup{domain: "dom-half", key: "0123456789abcdef", vcpus: 1,
		id:     vm.Identity{UID: uint32(h.qemuUID), GID: uint32(h.qemuGID)},
		record: func(n *vmNetwork) error { c := *n; recorded = &c; return nil }, undo: &undo})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "pod interface net1") {
		t.Fatalf("got %v, want FailedPrecondition naming net1", err)
	}
	if recorded == nil || len(recorded.Links) != 2 {
		t.Errorf("both TAPs must be in the record before the first is made: %+v", recorded)
	}
	undo.run()
	left := leftIn(t, netns)
	if strings.Contains(left, "kvmtap01234567") || strings.Count(left, "qdisc ingress") != 1 || !strings.Contains(left, "kvmtapother") {
		// Left: the other VM's TAP and net1's ingress qdisc (eth0 has none).
		t.Errorf("after the failed setup and rollback:\n%s", left)
	}
	if err := netfd.Unwire(netns, "net1", otherTAP.Name, created); err != nil {
		t.Fatal(err)
	}
	if err := netfd.DeleteTAP(netns, otherTAP.Name); err != nil {
		t.Fatal(err)
	}
	if left := leftIn(t, netns); left != "" {
		t.Errorf("left at the end:\n%s", left)
	}
}
