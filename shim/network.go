package shim

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"os/user"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
	"github.com/kvm-shim/containerd-shim-kvm-v1/configdrive"
	"github.com/kvm-shim/containerd-shim-kvm-v1/netfd"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// Where the VM's NICs sit: consecutive slots on the root bus from nicSlot0
// on, which libvirt leaves free (it fills slots from 1 upwards with root
// ports and its own devices; q35 keeps 0x1f). netfd.MaxInterfaces of them.
const (
	nicBus   = "pcie.0"
	nicSlot0 = 0x10
)

// vmNetwork is a VM's share of the pod network, as recorded for teardown.
type vmNetwork struct {
	Netns string      `json:"netns"`
	Links []wiredLink `json:"links,omitempty"`

	// The one link of a record written by a shim before several
	// interfaces: read, never written.
	PodIf        string `json:"podIf,omitempty"`
	TAP          string `json:"tap,omitempty"`
	CreatedQdisc bool   `json:"createdQdisc,omitempty"`
}

// wiredLink is one pod interface taken over by a TAP of the VM.
type wiredLink struct {
	PodIf        string `json:"podIf"`
	TAP          string `json:"tap"`
	CreatedQdisc bool   `json:"createdQdisc"`
}

// links returns the wired links, also of an older record.
func (n *vmNetwork) links() []wiredLink {
	if len(n.Links) == 0 && n.TAP != "" {
		return []wiredLink{{PodIf: n.PodIf, TAP: n.TAP, CreatedQdisc: n.CreatedQdisc}}
	}
	return n.Links
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

// tapName names the TAP of the VM's i-th NIC: kvmtap, 8 characters of
// the VM's key, and the NIC's index from the second on (15 characters at
// most, the kernel's limit).
func tapName(key string, i int) string {
	if i == 0 {
		return netfd.TAPPrefix + key[:8]
	}
	return netfd.TAPPrefix + key[:8] + strconv.Itoa(i)
}

// netQueues is how many TAP queues each NIC gets: one per vCPU up to
// max_net_queues, and fewer when the NICs' descriptors (with vhost-net
// twice as many) would not fit into one SCM_RIGHTS message.
func netQueues(vcpus, maxQueues, nics int, vhost bool) int {
	q := min(vcpus, maxQueues)
	per := 1
	if vhost {
		per = 2
	}
	return max(1, min(q, netfd.MaxDescriptors/(nics*per)))
}

// netPlan is the pod network a VM takes over, as the plan found it: the
// interfaces, the pod's DNS, what the config drive says of them, and the
// kernel's ip= argument when it can say it (else why not).
type netPlan struct {
	netns    string
	pod      netfd.PodNetwork
	guest    *configdrive.Network
	ipArg    string
	ipNotWhy string
}

// planNetwork reads the pod network of netns and refuses what the VM
// cannot take over: a pod whose interfaces or addresses changed since its
// sandbox saw them (sandboxNet; nil when none was recorded), or one the
// config drive cannot describe. It changes nothing.
func planNetwork(ctx context.Context, r createRequest, hostname string) (*netPlan, error) {
	pn, err := netfd.Inspect(r.netns)
	if err != nil {
		return nil, err
	}
	if r.podNet != nil {
		if err = pn.SameAs(*r.podNet); err != nil {
			return nil, err
		}
	}
	var dns []netip.Addr
	var search []string
	if b, readErr := os.ReadFile(resolvConf(r.spec)); readErr == nil {
		dns, search = configdrive.ParseResolvConf(b)
	} else if !errors.Is(readErr, fs.ErrNotExist) { // none is no DNS
		log.G(ctx).WithError(readErr).Warn("read the pod's resolv.conf")
	}
	np := &netPlan{netns: r.netns, pod: pn}
	if np.guest, err = driveNetwork(pn, dns, search); err != nil {
		return nil, err
	}
	if arg, why, ok := ipKernelArg(pn, dns, hostname); ok {
		np.ipArg = arg
	} else {
		np.ipNotWhy = why
	}
	return np, nil
}

// netSetup is what setupNetwork needs besides the plan: the VM's domain
// and runtime key (which name its TAPs), its vCPUs (which size the TAP
// queues) and identity (which alone may fetch the descriptors), record,
// which is given what the next step makes before it is taken, undo, and
// the options of the descriptor server.
type netSetup struct {
	domain, key string
	vcpus       int
	id          vm.Identity
	record      func(*vmNetwork) error
	undo        *rollback
	fdOpts      []netfd.ServeOption
}

// setupNetwork takes over the pod's CNI interfaces for the VM: for each,
// in interface order, a TAP in the pod namespace wired to it by tc, and
// one socket that hands all TAP queues (and vhost-net) to the VM's
// emulator wrapper, which gives the VM one NIC per interface. Each step's
// undo goes on undo as soon as it succeeds.
func setupNetwork(ctx context.Context, h *host, np *netPlan, s netSetup) (*netfd.Server, error) {
	netns, pn := np.netns, np.pod
	vhost := h.accel == vm.AccelKVM
	if vhost {
		if ok, why := netfd.VhostAvailable(); !ok {
			h.warnOnce("vhost", "vhost-net unavailable ("+why+"); VM networking uses QEMU's userspace virtio-net")
			vhost = false
		}
	} else {
		h.warnOnce("vhost", "vhost-net applies to KVM only; TCG VMs use QEMU's userspace virtio-net")
	}
	queues := netQueues(s.vcpus, h.cfg.MaxNetQueues, len(pn.Interfaces), vhost)
	n := &vmNetwork{Netns: netns}
	taps := make([]netfd.TAP, len(pn.Interfaces))
	grant := netfd.Grant{QEMU: h.cfg.QEMUBinary}
	for i, ifc := range pn.Interfaces {
		taps[i] = netfd.TAP{Name: tapName(s.key, i), Queues: queues, VNetHdr: h.cfg.VNetHdr, MTU: ifc.MTU}
		n.Links = append(n.Links, wiredLink{PodIf: ifc.Name, TAP: taps[i].Name})
		grant.NICs = append(grant.NICs, netfd.NIC{
			NetdevID: fmt.Sprintf("kvmnet%d", i), MAC: ifc.MAC.String(),
			Bus: nicBus, Addr: fmt.Sprintf("%#x", nicSlot0+i),
		})
	}
	// Every TAP is in the record before the first is made.
	if err := s.record(n); err != nil {
		return nil, err
	}
	for i, ifc := range pn.Interfaces {
		tap := taps[i]
		if createTAPErr := netfd.CreateTAP(netns, tap); createTAPErr != nil {
			return nil, fmt.Errorf("pod interface %s: %w", ifc.Name, createTAPErr)
		}
		s.undo.add(func() { _ = netfd.DeleteTAP(netns, tap.Name) })
		created, wireErr := netfd.Wire(netns, ifc.Name, tap.Name)
		if wireErr != nil {
			return nil, fmt.Errorf("pod interface %s: %w", ifc.Name, wireErr)
		}
		s.undo.add(func() { _ = netfd.Unwire(netns, ifc.Name, tap.Name, created) })
		n.Links[i].CreatedQdisc = created
		if recordErr := s.record(n); recordErr != nil {
			return nil, recordErr
		}
	}
	srv, err := serveNICs(ctx, h, nicGrant{netns: netns, taps: taps, queues: queues, vhost: vhost, grant: grant}, s)
	if err != nil {
		return nil, err
	}
	s.undo.add(func() { _ = srv.Close() })
	for i, ifc := range pn.Interfaces {
		log.G(ctx).WithField("vm", s.domain).WithField("tap", taps[i].Name).WithField("queues", queues).
			WithField("vnetHdr", h.cfg.VNetHdr).WithField("vhost", vhost).WithField("pci", grant.NICs[i].Addr).
			Info("VM network wired to " + ifc.Name)
	}
	return srv, nil
}

// nicGrant is what the VM's emulator wrapper is handed: the NICs, and
// the TAP queues (and vhost-net) of each.
type nicGrant struct {
	netns  string
	taps   []netfd.TAP
	queues int
	vhost  bool
	grant  netfd.Grant
}

// serveNICs opens the socket the VM's emulator wrapper fetches its NICs'
// descriptors from; they are opened when it asks.
func serveNICs(ctx context.Context, h *host, g nicGrant, s netSetup) (*netfd.Server, error) {
	c := netfd.ServerConfig{Dir: h.fdSocketDir, Domain: s.domain, QEMUUID: int(s.id.UID), QEMUGID: int(s.id.GID), PIDDir: vm.QEMUPidDir}
	c.Provide = func() (netfd.Grant, []netfd.NICFiles, error) {
		var files []netfd.NICFiles
		fail := func(err error) (netfd.Grant, []netfd.NICFiles, error) {
			for _, f := range files {
				f.Close()
			}
			return g.grant, nil, err
		}
		for _, tap := range g.taps {
			q, openQueuesErr := netfd.OpenQueues(g.netns, tap, g.queues)
			if openQueuesErr != nil {
				return fail(openQueuesErr)
			}
			files = append(files, netfd.NICFiles{TAP: q})
			if g.vhost {
				v, openVhostErr := netfd.OpenVhost(g.queues)
				if openVhostErr != nil {
					return fail(openVhostErr)
				}
				files[len(files)-1].Vhost = v
			}
		}
		return g.grant, files, nil
	}
	return c.Serve(ctx, s.fdOpts...)
}

// teardownNetwork removes what setupNetwork made; all of it may be gone.
func teardownNetwork(n *vmNetwork) error {
	if n == nil {
		return nil
	}
	var errs []error
	for _, l := range n.links() {
		if err := netfd.Unwire(n.Netns, l.PodIf, l.TAP, l.CreatedQdisc); err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, netfd.DeleteTAP(n.Netns, l.TAP))
	}
	return errors.Join(errs...)
}

// ipKernelArg renders the kernel's ip= parameter for a direct-boot guest,
// when it can say what the pod's network is:
// ip=<addr>::<gateway>:<netmask>:<hostname>::off:<dns0>:<dns1>, the device
// left empty (the first NIC). It cannot express several interfaces, IPv6,
// or a gateway outside the address's prefix (the kernel refuses it: "not
// on directly connected network"); why says which, when ok is false.
func ipKernelArg(pn netfd.PodNetwork, dns []netip.Addr, hostname string) (arg string, why string, ok bool) {
	if len(pn.Interfaces) != 1 {
		return "", fmt.Sprintf("the pod has %d interfaces", len(pn.Interfaces)), false
	}
	ifc := pn.Interfaces[0]
	var addr netip.Prefix
	for _, a := range ifc.Addrs {
		if !a.Addr().Is4() {
			return "", fmt.Sprintf("%s has the IPv6 address %s", ifc.Name, a), false
		}
		if addr.IsValid() {
			return "", fmt.Sprintf("%s has more than one address", ifc.Name), false
		}
		addr = a
	}
	gwS := ""
	for _, r := range ifc.Routes {
		if r.OnLink() || r.Dst.Bits() != 0 {
			return "", fmt.Sprintf("%s has the route %s %s", ifc.Name, r.Dst, routeVia(r)), false
		}
		if !addr.Masked().Contains(r.Gateway) {
			return "", fmt.Sprintf("the gateway %s of %s is outside %s", r.Gateway, ifc.Name, addr.Masked()), false
		}
		gwS = r.Gateway.String()
	}
	fields := []string{addr.Addr().String(), "", gwS, netmask4(addr.Bits()), hostname, "", "off"}
	n := 0
	for _, d := range dns {
		if d.Is4() && n < 2 {
			fields = append(fields, d.String())
			n++
		}
	}
	return "ip=" + strings.Join(fields, ":"), "", true
}

// guestNetworkPath decides how the guest learns the pod network. The
// config drive carries it for every guest (network_data.json for
// cloud-init and cloudbase-init, configdrive.GuestNetworkFile for small
// inits); a direct-boot guest also gets ip= on its command line when ip=
// can say it. Without a drive, a direct-boot guest whose network ip=
// cannot express is refused, and a disk image is told nothing (logged).
func guestNetworkPath(ctx context.Context, np *netPlan, domain string, src vm.BootSource, set *vmSettings) error {
	switch {
	case src.Kernel != "" && np.ipArg != "":
		set.cmdline += " " + np.ipArg
	case src.Kernel != "" && set.drive.Disabled:
		return fmt.Errorf("annotation %s=false: a direct-boot guest without a config drive gets its network from the kernel's ip=, which "+
			"cannot express this pod's network (%s): %w",
			annotations.ConfigDrive, np.ipNotWhy, errdefs.ErrInvalidArgument)
	case src.Kernel == "" && set.drive.Disabled:
		log.G(ctx).WithField("vm", domain).Warn("no config drive (annotation " + annotations.ConfigDrive +
			"=false): the guest gets no network configuration from the shim and must find its addresses itself")
	}
	return nil
}

func routeVia(r netfd.Route) string {
	if r.OnLink() {
		return "on-link"
	}
	return "via " + r.Gateway.String()
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
