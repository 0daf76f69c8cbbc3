package shim

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/user"
	"strconv"
	"strings"

	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kvm-shim/containerd-shim-kvm-v1/netfd"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// Where the VM's NIC sits: a slot on the root bus that libvirt leaves free
// (it fills slots from 1 upwards with root ports and its own devices).
const (
	nicBus  = "pcie.0"
	nicAddr = "0x10"
)

// vmNetwork is a VM's share of the pod network, as recorded for teardown.
type vmNetwork struct {
	Netns        string `json:"netns"`
	PodIf        string `json:"podIf"`
	TAP          string `json:"tap"`
	CreatedQdisc bool   `json:"createdQdisc"`
}

// podNetns is the network namespace a VM container joins: its sandbox's
// (CRI points the container's own spec at the sandbox task's pid, which is
// the shim's, in the host namespace), else a path in its own spec that is
// not the shim's namespace (ctr run --with-ns network:...), else none.
func podNetns(spec *specs.Spec, sandboxNetns string) string {
	if sandboxNetns != "" {
		return sandboxNetns
	}
	p := netnsPath(spec)
	if p == "" || p == fmt.Sprintf("/proc/%d/ns/net", os.Getpid()) || strings.HasPrefix(p, "/proc/self/") {
		return ""
	}
	return p
}

// resolvConf is the resolv.conf CRI mounts into the container.
func resolvConf(spec *specs.Spec) string {
	for _, m := range spec.Mounts {
		if m.Destination == "/etc/resolv.conf" {
			return m.Source
		}
	}
	return ""
}

// setupNetwork takes over the pod's CNI interface for the VM: a TAP in the
// pod namespace wired to it by tc, and a socket that hands the TAP queues
// (and vhost-net) to the VM's emulator wrapper. record is given what the
// next step makes before it is taken, and each step's undo goes on undo
// as soon as it succeeds.
func setupNetwork(ctx context.Context, h *host, netns, domain, key string, vcpus int, record func(*vmNetwork) error, undo *rollback, fdOpts ...netfd.ServeOption) (*vmNetwork, netfd.PodNetwork, *netfd.Server, error) {
	pn, err := netfd.Inspect(netns)
	if err != nil {
		return nil, pn, nil, err
	}
	queues := min(vcpus, h.cfg.MaxNetQueues)
	tap := netfd.TAP{Name: netfd.TAPPrefix + key[:8], Queues: queues, VNetHdr: h.cfg.VNetHdr, MTU: pn.MTU}
	n := &vmNetwork{Netns: netns, PodIf: pn.Interface, TAP: tap.Name}
	if err := record(n); err != nil {
		return nil, pn, nil, err
	}
	if err := netfd.CreateTAP(netns, tap); err != nil {
		return nil, pn, nil, err
	}
	undo.add(func() { _ = netfd.DeleteTAP(netns, tap.Name) })
	created, err := netfd.Wire(netns, pn.Interface, tap.Name)
	if err != nil {
		return nil, pn, nil, err
	}
	undo.add(func() { _ = netfd.Unwire(netns, pn.Interface, tap.Name, created) })
	n.CreatedQdisc = created
	if err := record(n); err != nil {
		return nil, pn, nil, err
	}

	vhost := h.accel == vm.AccelKVM
	if vhost {
		if ok, why := netfd.VhostAvailable(); !ok {
			h.warnOnce("vhost", "vhost-net unavailable ("+why+"); VM networking uses QEMU's userspace virtio-net")
			vhost = false
		}
	} else {
		h.warnOnce("vhost", "vhost-net applies to KVM only; TCG VMs use QEMU's userspace virtio-net")
	}
	grant := netfd.Grant{QEMU: h.cfg.QEMUBinary, NetdevID: "kvmnet0", MAC: pn.MAC.String(), Bus: nicBus, Addr: nicAddr}
	srv, err := netfd.Serve(ctx, h.fdSocketDir, domain, h.qemuUID, h.qemuGID, vm.QEMUPidDir, func() (netfd.Grant, []*os.File, []*os.File, error) {
		q, err := netfd.OpenQueues(netns, tap, queues)
		if err != nil {
			return grant, nil, nil, err
		}
		if !vhost {
			return grant, q, nil, nil
		}
		v, err := netfd.OpenVhost(queues)
		if err != nil {
			for _, f := range q {
				f.Close()
			}
			return grant, nil, nil, err
		}
		return grant, q, v, nil
	}, fdOpts...)
	if err != nil {
		return nil, pn, nil, err
	}
	undo.add(func() { _ = srv.Close() })
	log.G(ctx).WithField("vm", domain).WithField("tap", tap.Name).WithField("queues", queues).
		WithField("vnetHdr", tap.VNetHdr).WithField("vhost", vhost).Info("VM network wired to " + pn.Interface)
	return n, pn, srv, nil
}

// teardownNetwork removes what setupNetwork made; all of it may be gone.
func teardownNetwork(n *vmNetwork) error {
	if n == nil {
		return nil
	}
	if err := netfd.Unwire(n.Netns, n.PodIf, n.TAP, n.CreatedQdisc); err != nil {
		return err
	}
	return netfd.DeleteTAP(n.Netns, n.TAP)
}

// ipKernelArg renders the kernel's ip= parameter for a direct-boot guest:
// ip=<addr>::<gateway>:<netmask>:<hostname>::off:<dns0>:<dns1>. The device
// is left empty (the first NIC). Only IPv4 can be expressed.
func ipKernelArg(pn netfd.PodNetwork, dns []netip.Addr, hostname string) string {
	var addr netip.Prefix
	for _, a := range pn.Addrs {
		if a.Addr().Is4() {
			addr = a
			break
		}
	}
	if !addr.IsValid() {
		return ""
	}
	gw, _ := pn.Gateway()
	gwS := ""
	if gw.IsValid() {
		gwS = gw.String()
	}
	fields := []string{addr.Addr().String(), "", gwS, netmask4(addr.Bits()), hostname, "", "off"}
	n := 0
	for _, d := range dns {
		if d.Is4() && n < 2 {
			fields = append(fields, d.String())
			n++
		}
	}
	return "ip=" + strings.Join(fields, ":")
}

func netmask4(bits int) string {
	m := uint32(0xffffffff) << (32 - bits)
	if bits == 0 {
		m = 0
	}
	return netip.AddrFrom4([4]byte{byte(m >> 24), byte(m >> 16), byte(m >> 8), byte(m)}).String()
}

// lookupQEMUUser finds the user libvirt runs QEMU as.
func lookupQEMUUser(name string) (uid, gid int, err error) {
	u, err := user.Lookup(name)
	if err != nil {
		return 0, 0, fmt.Errorf("qemu_user %q: %w", name, err)
	}
	uid, _ = strconv.Atoi(u.Uid)
	gid, _ = strconv.Atoi(u.Gid)
	return uid, gid, nil
}
