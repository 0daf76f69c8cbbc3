package configdrive

import (
	"bytes"
	"fmt"
	"strings"
)

// GuestNetworkFile is where the drive carries the network once more, in
// a line format a shell reads without a JSON parser: for guests without
// cloud-init, such as direct-boot guests with a small init (the kernel's
// ip= cannot express IPv6, several NICs or a gateway outside the
// address's prefix). It is written only when there is a network.
const GuestNetworkFile = "kvm/network"

// renderGuestNetwork writes GuestNetworkFile: one record per line, fields
// separated by single spaces, in this order:
//
//	link <mac> <mtu>                 one per NIC, in NIC order (mtu 0: not given)
//	addr <mac> <address>/<prefix>    static addresses of the NIC with that MAC
//	route <mac> <dst>/<prefix> <gw>  routes, on-link ones (gw "onlink") first
//	dns <address>                    DNS servers, in order
//	search <domain>                  search domains, in order
//
// Lines starting with # are comments. Every field is an address, a
// number or a checked domain name, so no field holds a space.
func renderGuestNetwork(n *Network) ([]byte, error) {
	if err := n.validate(); err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.WriteString("# guest network, from containerd-shim-kvm-v1 (the same as openstack/latest/network_data.json)\n")
	mac := map[string]string{}
	for _, l := range n.Links {
		mac[l.ID] = l.MAC.String()
		fmt.Fprintf(&b, "link %s %d\n", l.MAC, l.MTU)
	}
	for _, nt := range n.Networks {
		fmt.Fprintf(&b, "addr %s %s\n", mac[nt.Link], nt.Address)
	}
	for _, onLink := range []bool{true, false} {
		for _, nt := range n.Networks {
			for _, r := range nt.Routes {
				if r.Gateway.IsUnspecified() != onLink {
					continue
				}
				gw := r.Gateway.String()
				if onLink {
					gw = "onlink"
				}
				fmt.Fprintf(&b, "route %s %s %s\n", mac[nt.Link], r.Dst.Masked(), gw)
			}
		}
	}
	for _, d := range n.DNS {
		fmt.Fprintf(&b, "dns %s\n", d)
	}
	for _, d := range n.Search {
		if strings.ContainsAny(d, " \t\n") {
			return nil, fmt.Errorf("search domain %q holds a space", d) // validate refuses it first
		}
		fmt.Fprintf(&b, "search %s\n", d)
	}
	return b.Bytes(), nil
}
