package configdrive

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/containerd/errdefs"
)

// Network is the guest's network configuration, rendered as nova's
// network_data.json. Build it with NewNetwork, or by hand for several links.
type Network struct {
	Links    []Link
	Networks []Net
	// DNS servers, rendered as top-level services of type "dns".
	DNS []netip.Addr
	// Search domains, rendered as "search" of the first top-level dns service:
	// not in nova's schema, but cloud-init reads it (a Kubernetes pod needs
	// them to resolve service names) and other readers ignore it.
	Search []string
}

// Link is a network_data.json "links" entry: one guest NIC.
type Link struct {
	// ID names the link for Net.Link (nova uses the host TAP name).
	ID string
	// Type is nova's link type; "" means "phy".
	Type string
	// MAC is the guest NIC's address ("ethernet_mac_address"): guests find
	// their interface by it.
	MAC net.HardwareAddr
	// MTU of the link; 0 omits it.
	MTU int
}

// Net is a network_data.json "networks" entry: one static address on a link.
type Net struct {
	// ID of the entry, e.g. "network0".
	ID string
	// Link is the ID of the Link the address is on.
	Link string
	// Address is the static address and its prefix length; the family gives
	// the type ("ipv4" or "ipv6").
	Address netip.Prefix
	// Routes through gateways on this network (the default route is
	// Dst 0.0.0.0/0 or ::/0).
	Routes []Route
	// NetworkID is nova's "network_id" (a neutron network uuid there);
	// "" gives a uuid derived from the address's subnet.
	NetworkID string
}

// Route is a route in a Net. A Gateway of 0.0.0.0 or :: makes it on-link.
type Route struct {
	Dst     netip.Prefix
	Gateway netip.Addr
}

// NewNetwork builds a one-link Network: the NIC with mac and mtu (0: not
// given), its addresses and routes (see AddLink), and dns as the DNS
// servers (set Search afterwards for search domains). Errors wrap
// errdefs.ErrInvalidArgument.
func NewNetwork(mac net.HardwareAddr, mtu int, addrs []netip.Prefix, routes []Route, dns []netip.Addr) (*Network, error) {
	n := &Network{DNS: append([]netip.Addr(nil), dns...)}
	if err := n.AddLink(mac, mtu, addrs, routes); err != nil {
		return nil, err
	}
	return n, nil
}

// AddLink adds the next guest NIC (link ids "interface0", "interface1",
// ... in the order added, so the same pod gives the same ids) with mac and
// mtu (0: not given): one static Net per address, and each route on the
// Net of the same family whose subnet holds its gateway, else on the first
// Net of that family. A route whose gateway is the unspecified address
// (0.0.0.0 or ::) is on-link: cloud-init renders it as a route without
// gateway, which the guest's kernel gives link scope. That is how a /32
// pod reaches a gateway outside its prefix (Calico's 169.254.1.1, Cilium's
// cilium_host address). Errors wrap errdefs.ErrInvalidArgument.
func (n *Network) AddLink(mac net.HardwareAddr, mtu int, addrs []netip.Prefix, routes []Route) error {
	if len(mac) != 6 {
		return fmt.Errorf("MAC address %q is not a 6-byte Ethernet address: %w", mac, errdefs.ErrInvalidArgument)
	}
	if mtu < 0 || mtu > 65535 {
		return fmt.Errorf("MTU %d out of range: %w", mtu, errdefs.ErrInvalidArgument)
	}
	link := Link{ID: fmt.Sprintf("interface%d", len(n.Links)), Type: "phy", MAC: mac, MTU: mtu}
	var nets []Net
	for _, a := range addrs {
		nets = append(nets, Net{ID: fmt.Sprintf("network%d", len(n.Networks)+len(nets)), Link: link.ID, Address: a})
	}
	for _, r := range routes {
		if !r.Dst.IsValid() || !r.Gateway.IsValid() {
			return fmt.Errorf("route %v via %v on %s: destination and gateway are required (the unspecified address for on-link): %w",
				r.Dst, r.Gateway, mac, errdefs.ErrInvalidArgument)
		}
		best := -1
		for i, nt := range nets {
			if nt.Address.Addr().Is4() != r.Gateway.Is4() {
				continue
			}
			if nt.Address.Masked().Contains(r.Gateway) {
				best = i
				break
			}
			if best < 0 {
				best = i
			}
		}
		if best < 0 {
			return fmt.Errorf("route %v via %v on %s: the link has no address of the route's family: %w", r.Dst, r.Gateway, mac,
				errdefs.ErrInvalidArgument)
		}
		nets[best].Routes = append(nets[best].Routes, r)
	}
	n.Links = append(n.Links, link)
	n.Networks = append(n.Networks, nets...)
	if err := n.validate(); err != nil {
		n.Links, n.Networks = n.Links[:len(n.Links)-1], n.Networks[:len(n.Networks)-len(nets)]
		return err
	}
	return nil
}

// validate checks what rendering relies on.
func (n *Network) validate() error {
	links := map[string]bool{}
	macs := map[string]string{}
	for _, l := range n.Links {
		if other, dup := macs[l.MAC.String()]; dup {
			return fmt.Errorf("links %s and %s have the same MAC %s: the guest could not tell its NICs apart: %w", other, l.ID, l.MAC,
				errdefs.ErrInvalidArgument)
		}
		macs[l.MAC.String()] = l.ID
		if l.ID == "" {
			return fmt.Errorf("link with empty id: %w", errdefs.ErrInvalidArgument)
		}
		if len(l.MAC) != 6 {
			return fmt.Errorf("link %s: MAC address %q is not a 6-byte Ethernet address: %w", l.ID, l.MAC, errdefs.ErrInvalidArgument)
		}
		links[l.ID] = true
	}
	for _, nt := range n.Networks {
		if !links[nt.Link] {
			return fmt.Errorf("network %s: no link %q: %w", nt.ID, nt.Link, errdefs.ErrInvalidArgument)
		}
		if !nt.Address.IsValid() || nt.Address.Addr().Zone() != "" || nt.Address.Addr().Is4In6() {
			return fmt.Errorf("network %s: address %v is not a valid prefix: %w", nt.ID, nt.Address, errdefs.ErrInvalidArgument)
		}
		for _, r := range nt.Routes {
			if !r.Dst.IsValid() || !r.Gateway.IsValid() ||
				r.Dst.Addr().Is4() != nt.Address.Addr().Is4() || r.Gateway.Is4() != nt.Address.Addr().Is4() {
				return fmt.Errorf("network %s: route %v via %v does not match the address family: %w",
					nt.ID, r.Dst, r.Gateway, errdefs.ErrInvalidArgument)
			}
		}
	}
	for _, d := range n.DNS {
		if !d.IsValid() {
			return fmt.Errorf("invalid DNS server address: %w", errdefs.ErrInvalidArgument)
		}
	}
	for _, d := range n.Search {
		if d == "" || len(d) > 253 || strings.ContainsFunc(d, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
			return fmt.Errorf("DNS search domain %q is not a domain name: %w", d, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// ParseResolvConf returns the DNS servers (the "nameserver" lines, in
// order) and search domains (the last "search" or "domain" line, as the
// resolver reads it) of a resolv.conf such as the pod's. Servers that do
// not parse, and zoned IPv6 link-local ones that mean nothing in the guest,
// are skipped.
func ParseResolvConf(resolvConf []byte) (servers []netip.Addr, search []string) {
	sc := bufio.NewScanner(bytes.NewReader(resolvConf))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "nameserver":
			a, err := netip.ParseAddr(f[1])
			if err != nil || a.Zone() != "" {
				continue
			}
			servers = append(servers, a.Unmap())
		case "search", "domain":
			search = nil
			for _, d := range f[1:] {
				if strings.HasPrefix(d, "#") || strings.HasPrefix(d, ";") {
					break
				}
				search = append(search, d)
			}
		}
	}
	return servers, search
}

// JSON shapes of nova's network_data.json.
type networkData struct {
	Links    []linkJSON    `json:"links"`
	Networks []netJSON     `json:"networks"`
	Services []serviceJSON `json:"services"`
}

type linkJSON struct {
	ID   string `json:"id"`
	Type string `json:"type"`
	MAC  string `json:"ethernet_mac_address"`
	MTU  *int   `json:"mtu"`
}

type netJSON struct {
	ID        string        `json:"id"`
	Type      string        `json:"type"`
	Link      string        `json:"link"`
	IPAddress string        `json:"ip_address"`
	Netmask   string        `json:"netmask"`
	Routes    []routeJSON   `json:"routes"`
	NetworkID string        `json:"network_id"`
	Services  []serviceJSON `json:"services,omitempty"`
}

type routeJSON struct {
	Network string `json:"network"`
	Netmask string `json:"netmask"`
	Gateway string `json:"gateway"`
}

type serviceJSON struct {
	Type    string   `json:"type"`
	Address string   `json:"address"`
	Search  []string `json:"search,omitempty"`
}

// renderNetworkData returns network_data.json; a nil Network gives the
// empty document nova writes for an instance without ports.
func renderNetworkData(n *Network) ([]byte, error) {
	nd := networkData{Links: []linkJSON{}, Networks: []netJSON{}, Services: []serviceJSON{}}
	if n != nil {
		if err := n.validate(); err != nil {
			return nil, err
		}
		for _, l := range n.Links {
			lj := linkJSON{ID: l.ID, Type: l.Type, MAC: l.MAC.String()}
			if lj.Type == "" {
				lj.Type = "phy"
			}
			if l.MTU > 0 {
				mtu := l.MTU
				lj.MTU = &mtu
			}
			nd.Links = append(nd.Links, lj)
		}
		for _, d := range n.DNS {
			svc := serviceJSON{Type: "dns", Address: d.String()}
			if len(nd.Services) == 0 {
				svc.Search = n.Search // once: cloud-init appends each service's list
			}
			nd.Services = append(nd.Services, svc)
		}
		for _, nt := range n.Networks {
			nj := netJSON{
				ID:        nt.ID,
				Type:      "ipv6",
				Link:      nt.Link,
				IPAddress: nt.Address.Addr().String(),
				Netmask:   netmask(nt.Address.Addr().Is4(), nt.Address.Bits()),
				Routes:    []routeJSON{},
				NetworkID: nt.NetworkID,
			}
			if nt.Address.Addr().Is4() {
				nj.Type = "ipv4"
			}
			if nj.NetworkID == "" {
				nj.NetworkID = uuidV5(uuidNamespace, "network "+nt.Address.Masked().String())
			}
			for _, r := range nt.Routes {
				nj.Routes = append(nj.Routes, routeJSON{
					Network: r.Dst.Masked().Addr().String(),
					Netmask: netmask(r.Dst.Addr().Is4(), r.Dst.Bits()),
					Gateway: r.Gateway.String(),
				})
			}
			// nova repeats the DNS servers of the network's family here.
			for _, d := range n.DNS {
				if d.Is4() == nt.Address.Addr().Is4() {
					nj.Services = append(nj.Services, serviceJSON{Type: "dns", Address: d.String()})
				}
			}
			nd.Networks = append(nd.Networks, nj)
		}
	}
	return marshal(nd)
}

// netmask renders a prefix length as a dotted (IPv4) or colon (IPv6)
// netmask, as nova writes it.
func netmask(v4 bool, bits int) string {
	size := 128
	if v4 {
		size = 32
	}
	m := net.CIDRMask(bits, size)
	ip := net.IP(m)
	if v4 {
		return ip.To4().String()
	}
	return ip.String()
}
