package netfd

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// MaxInterfaces is how many pod interfaces one VM takes: the VM's NICs sit
// on fixed slots of the root PCI bus that libvirt leaves free (0x10 and
// up; libvirt fills slots from 1 upwards, and q35 keeps 0x1f).
const MaxInterfaces = 8

// PodNetwork is what CNI set up in the pod's network namespace, as the VM
// must take it over: one guest NIC per interface, in interface order.
type PodNetwork struct {
	Interfaces []Interface `json:"interfaces"`
}

// Interface is one CNI interface of the pod (eth0, net1, ...): the guest
// NIC gets its MAC and MTU, and the guest its addresses and routes.
type Interface struct {
	Name   string           `json:"name"`
	MAC    net.HardwareAddr `json:"mac"`
	MTU    int              `json:"mtu"`
	Addrs  []netip.Prefix   `json:"addrs"`  // global unicast addresses with their prefix length
	Routes []Route          `json:"routes"` // including the default routes
}

// Route is a route of the pod through one interface: to Dst via Gateway,
// or on-link (link scope) when Gateway is the zero Addr. Calico and
// Cilium give a /32 pod an on-link route to a gateway outside its prefix,
// then the default route via that gateway.
type Route struct {
	Dst     netip.Prefix `json:"dst"`
	Gateway netip.Addr   `json:"gateway,omitzero"`
}

// OnLink reports whether the route has no gateway.
func (r Route) OnLink() bool { return !r.Gateway.IsValid() }

// DefaultGateway returns the interface's default gateway of one family.
func (i Interface) DefaultGateway(v4 bool) (netip.Addr, bool) {
	for _, r := range i.Routes {
		if r.Dst.Bits() == 0 && r.Dst.Addr().Is4() == v4 && r.Gateway.IsValid() {
			return r.Gateway, true
		}
	}
	return netip.Addr{}, false
}

// Inspect reads the pod's network from its namespace: every interface
// besides loopback (and the TAPs this package made, whose names start
// with TAPPrefix), in interface order (eth0, net1, net2, ...). Each must
// be an Ethernet interface with an address, and there may be at most
// MaxInterfaces; else the error names the interface (InvalidArgument).
func Inspect(netnsPath string) (PodNetwork, error) {
	ns, err := openNetns(netnsPath)
	if err != nil {
		return PodNetwork{}, err
	}
	defer ns.Close()
	// One handle in the pod's namespace: no thread has to join it.
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return PodNetwork{}, fmt.Errorf("netlink in %s: %w", netnsPath, err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return PodNetwork{}, fmt.Errorf("list links of %s: %w", netnsPath, err)
	}
	var cni []netlink.Link
	for _, l := range links {
		a := l.Attrs()
		if a.Flags&net.FlagLoopback != 0 || strings.HasPrefix(a.Name, TAPPrefix) {
			continue
		}
		cni = append(cni, l)
	}
	slices.SortFunc(cni, func(a, b netlink.Link) int { return compareIfNames(a.Attrs().Name, b.Attrs().Name) })
	if len(cni) == 0 {
		return PodNetwork{}, fmt.Errorf("no CNI interface in pod network namespace %s (only loopback): %w", netnsPath,
			errdefs.ErrFailedPrecondition)
	}
	if len(cni) > MaxInterfaces {
		return PodNetwork{}, fmt.Errorf("pod network namespace %s has %d interfaces (%s); a VM takes at most %d (the free PCI slots for its "+
			"NICs): %w",
			netnsPath, len(cni), strings.Join(linkNames(cni), ", "), MaxInterfaces, errdefs.ErrInvalidArgument)
	}
	var pn PodNetwork
	for _, l := range cni {
		ifc, err := inspectLink(h, l)
		if err != nil {
			return PodNetwork{}, fmt.Errorf("pod network namespace %s: %w", netnsPath, err)
		}
		pn.Interfaces = append(pn.Interfaces, ifc)
	}
	return pn, nil
}

// inspectLink reads one CNI interface and checks that the tc redirect can
// carry it to a guest NIC: Ethernet frames, its own MAC, ARP.
func inspectLink(h *netlink.Handle, l netlink.Link) (Interface, error) {
	a := l.Attrs()
	ifc := Interface{Name: a.Name, MAC: a.HardwareAddr, MTU: a.MTU}
	if a.EncapType != "ether" || len(a.HardwareAddr) != 6 {
		return ifc, fmt.Errorf("interface %s (%s, link type %s) has no Ethernet address: a VM NIC needs Ethernet frames and a MAC: %w",
			a.Name, l.Type(), a.EncapType, errdefs.ErrInvalidArgument)
	}
	if a.RawFlags&unix.IFF_NOARP != 0 {
		return ifc, fmt.Errorf("interface %s (%s) does no ARP (e.g. ipvlan in L3 mode): "+
			"the guest could not resolve its neighbours through it: %w",
			a.Name, l.Type(), errdefs.ErrInvalidArgument)
	}
	addrs, err := h.AddrList(l, unix.AF_UNSPEC)
	if err != nil {
		return ifc, fmt.Errorf("list addresses of %s: %w", a.Name, err)
	}
	for _, ad := range addrs {
		ip, ok := netip.AddrFromSlice(ad.IP)
		if !ok || !ip.Unmap().IsGlobalUnicast() {
			continue
		}
		ones, _ := ad.Mask.Size()
		ifc.Addrs = append(ifc.Addrs, netip.PrefixFrom(ip.Unmap(), ones))
	}
	if len(ifc.Addrs) == 0 {
		return ifc, fmt.Errorf("interface %s has no IP address (only link-local ones, if any): CNI gave the guest nothing to use: %w",
			a.Name, errdefs.ErrInvalidArgument)
	}
	routes, err := h.RouteList(l, unix.AF_UNSPEC)
	if err != nil {
		return ifc, fmt.Errorf("list routes of %s: %w", a.Name, err)
	}
	ifc.Addrs = hostAddrsWithoutPrefixRoute(ifc.Addrs, routes)
	for _, r := range routes {
		if rt, ok := convertRoute(r, ifc.Addrs); ok {
			ifc.Routes = append(ifc.Routes, rt)
		}
	}
	// On-link routes first: a route via a gateway outside the address's
	// prefix needs the on-link route to that gateway in place.
	slices.SortStableFunc(ifc.Routes, func(x, y Route) int {
		if x.OnLink() != y.OnLink() {
			if x.OnLink() {
				return -1
			}
			return 1
		}
		return strings.Compare(x.Dst.String(), y.Dst.String())
	})
	return ifc, nil
}

// hostAddrsWithoutPrefixRoute turns an address whose prefix is not on-link
// in the pod into a host address (/32, /128): ptp deletes the kernel's
// prefix route and routes the prefix via its gateway instead. The guest's
// kernel would add that prefix route back for the same address, and reach
// the prefix's other addresses by ARP that nobody answers.
func hostAddrsWithoutPrefixRoute(addrs []netip.Prefix, routes []netlink.Route) []netip.Prefix {
	onLink := map[netip.Prefix]bool{}
	for _, r := range routes {
		if r.Dst == nil || len(r.Gw) != 0 {
			continue
		}
		if ip, ok := netip.AddrFromSlice(r.Dst.IP); ok {
			ones, _ := r.Dst.Mask.Size()
			onLink[netip.PrefixFrom(ip.Unmap(), ones).Masked()] = true
		}
	}
	out := make([]netip.Prefix, len(addrs))
	for i, a := range addrs {
		out[i] = a
		if a.Bits() < a.Addr().BitLen() && !onLink[a.Masked()] {
			out[i] = netip.PrefixFrom(a.Addr(), a.Addr().BitLen())
		}
	}
	return out
}

// convertRoute turns a main-table route of the interface into the pod's
// route; the kernel's own (the prefix routes of the addresses, link-local
// and multicast) are left out, since the guest's kernel makes them too.
func convertRoute(r netlink.Route, addrs []netip.Prefix) (Route, bool) {
	if r.Protocol == unix.RTPROT_KERNEL || (r.Type != 0 && r.Type != unix.RTN_UNICAST) || len(r.MultiPath) > 0 {
		return Route{}, false
	}
	var rt Route
	if gw, ok := netip.AddrFromSlice(r.Gw); ok {
		rt.Gateway = gw.Unmap()
	}
	switch {
	case r.Dst != nil:
		ip, ok := netip.AddrFromSlice(r.Dst.IP)
		if !ok {
			return Route{}, false
		}
		ones, _ := r.Dst.Mask.Size()
		rt.Dst = netip.PrefixFrom(ip.Unmap(), ones)
	case r.Family == unix.AF_INET6 || (rt.Gateway.IsValid() && rt.Gateway.Is6()):
		rt.Dst = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
	default:
		rt.Dst = netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	}
	if (rt.Dst.Addr().Is6() && rt.Dst.Addr().IsLinkLocalUnicast()) || rt.Dst.Addr().IsMulticast() {
		return Route{}, false
	}
	if rt.OnLink() {
		for _, a := range addrs {
			if a.Masked() == rt.Dst.Masked() {
				return Route{}, false // the address's own prefix route
			}
		}
	}
	return rt, true
}

// compareIfNames orders interface names as CNI and Multus number them:
// by the name without its trailing number, then by the number (eth0
// before net1, net2 before net10).
func compareIfNames(a, b string) int {
	sa, na := splitIfName(a)
	sb, nb := splitIfName(b)
	if a, b := ifClass(sa), ifClass(sb); a != b {
		return a - b
	}
	if c := strings.Compare(sa, sb); c != 0 {
		return c
	}
	if na != nb {
		return na - nb
	}
	return strings.Compare(a, b)
}

// ifClass puts the pod's primary interface (eth*) before the others.
func ifClass(stem string) int {
	if stem == "eth" {
		return 0
	}
	return 1
}

func splitIfName(s string) (string, int) {
	i := len(s)
	for i > 0 && s[i-1] >= '0' && s[i-1] <= '9' {
		i--
	}
	n, err := strconv.Atoi(s[i:])
	if err != nil {
		return s, -1
	}
	return s[:i], n
}

func linkNames(ls []netlink.Link) []string {
	names := make([]string, len(ls))
	for i, l := range ls {
		names[i] = l.Attrs().Name
	}
	return names
}

// SameAs reports how the network differs from an earlier inspection of
// the same pod (the sandbox's): another interface set, MAC or address
// means CNI's result changed since, and the VM would get a network that
// is not the pod's. nil when they match.
func (p PodNetwork) SameAs(earlier PodNetwork) error {
	desc := func(n PodNetwork) string {
		var parts []string
		for _, i := range n.Interfaces {
			var as []string
			for _, a := range i.Addrs {
				as = append(as, a.String())
			}
			parts = append(parts, fmt.Sprintf("%s %s [%s]", i.Name, i.MAC, strings.Join(as, " ")))
		}
		return strings.Join(parts, "; ")
	}
	if now, then := desc(p), desc(earlier); now != then {
		return fmt.Errorf("the pod's network changed since its sandbox was set up (then: %s; now: %s): %w",
			then, now, errdefs.ErrFailedPrecondition)
	}
	return nil
}
