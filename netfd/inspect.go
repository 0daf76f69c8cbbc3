package netfd

import (
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// PodNetwork is what CNI set up in the pod's network namespace, as the VM
// must take it over: the guest NIC gets the interface's MAC and the pod's
// addresses and routes.
type PodNetwork struct {
	Interface string
	MAC       net.HardwareAddr
	MTU       int
	Addrs     []netip.Prefix // global unicast addresses with their prefix length
	Routes    []Route        // including the default routes
	DNS       []netip.Addr
	Search    []string
}

// Route is a route of the pod: to Dst via Gateway (zero for on-link).
type Route struct {
	Dst     netip.Prefix
	Gateway netip.Addr
}

// Gateway returns the default IPv4 gateway, if any.
func (p PodNetwork) Gateway() (netip.Addr, bool) {
	for _, r := range p.Routes {
		if r.Dst.Bits() == 0 && r.Dst.Addr().Is4() && r.Gateway.IsValid() {
			return r.Gateway, true
		}
	}
	return netip.Addr{}, false
}

// Inspect reads the pod's network from its namespace. There must be
// exactly one interface besides loopback (and any TAP this package made,
// whose names start with TAPPrefix).
func Inspect(netnsPath string) (PodNetwork, error) {
	var pn PodNetwork
	err := inNetns(netnsPath, func(h *netlink.Handle) error {
		links, err := h.LinkList()
		if err != nil {
			return fmt.Errorf("list links: %w", err)
		}
		var cni []netlink.Link
		for _, l := range links {
			a := l.Attrs()
			if a.Flags&net.FlagLoopback != 0 || strings.HasPrefix(a.Name, TAPPrefix) {
				continue
			}
			cni = append(cni, l)
		}
		switch len(cni) {
		case 0:
			return fmt.Errorf("no CNI interface in pod network namespace %s (only loopback): %w", netnsPath, errdefs.ErrFailedPrecondition)
		case 1:
		default:
			var names []string
			for _, l := range cni {
				names = append(names, l.Attrs().Name)
			}
			return fmt.Errorf("more than one interface in pod network namespace %s (%s); a VM takes over exactly one: %w",
				netnsPath, strings.Join(names, ", "), errdefs.ErrFailedPrecondition)
		}
		l := cni[0]
		a := l.Attrs()
		pn.Interface, pn.MAC, pn.MTU = a.Name, a.HardwareAddr, a.MTU
		if len(pn.MAC) != 6 {
			return fmt.Errorf("interface %s has no Ethernet address: %w", a.Name, errdefs.ErrFailedPrecondition)
		}
		addrs, err := h.AddrList(l, unix.AF_UNSPEC)
		if err != nil {
			return fmt.Errorf("list addresses of %s: %w", a.Name, err)
		}
		for _, ad := range addrs {
			ip, ok := netip.AddrFromSlice(ad.IP)
			if !ok || !ip.Unmap().IsGlobalUnicast() {
				continue
			}
			ones, _ := ad.Mask.Size()
			pn.Addrs = append(pn.Addrs, netip.PrefixFrom(ip.Unmap(), ones))
		}
		routes, err := h.RouteList(l, unix.AF_UNSPEC)
		if err != nil {
			return fmt.Errorf("list routes of %s: %w", a.Name, err)
		}
		for _, r := range routes {
			if rt, ok := convertRoute(r); ok {
				pn.Routes = append(pn.Routes, rt)
			}
		}
		sort.Slice(pn.Routes, func(i, j int) bool { return pn.Routes[i].Dst.String() < pn.Routes[j].Dst.String() })
		return nil
	})
	return pn, err
}

func convertRoute(r netlink.Route) (Route, bool) {
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
	// Link-local IPv6 routes and multicast are the kernel's own.
	if rt.Dst.Addr().IsLinkLocalUnicast() || rt.Dst.Addr().IsMulticast() {
		return Route{}, false
	}
	return rt, true
}
