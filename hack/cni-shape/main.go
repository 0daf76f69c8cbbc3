// Command kvm-cni-shape is a chained CNI plugin for the shim's tests. It
// reshapes the result of the plugin before it (ptp or bridge) into a pod
// network as other CNIs build it, since those CNIs are not packaged here:
//
//	"calico"  after ptp: /32 (and /128) addresses, an on-link route to
//	          169.254.1.1 and the default route via it; IPv6 default route
//	          via the link-local fe80::ecee:eeff:feee:eeee, which the host
//	          veth carries (with MAC ee:ee:ee:ee:ee:ee); proxy ARP on the
//	          host veth answers for 169.254.1.1, as Calico's Felix sets it.
//	"cilium"  after ptp: a /32 address, an on-link route to the address
//	          of a host-side veth pair like Cilium's cilium_host (config
//	          "gateway", e.g. 10.99.0.1) and the default route via it; the
//	          host answers ARP for its own address on the pod's veth.
//	"net1"    after bridge: a second interface, as Multus adds one: a veth
//	          net1 in the pod with 10.90.<c>.<d>/24 (c.d: the last two bytes
//	          of eth0's IPv4 address), its host end with 10.90.<c>.254/24.
//
// It speaks CNI 1.0.0 (ADD, DEL, CHECK, VERSION) with no library: the
// environment and stdin as the CNI spec has them. It is test equipment:
// it trusts its configuration.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

const (
	calicoGW4 = "169.254.1.1"
	calicoGW6 = "fe80::ecee:eeff:feee:eeee"
	calicoMAC = "ee:ee:ee:ee:ee:ee"
)

type config struct {
	CNIVersion string  `json:"cniVersion"`
	Name       string  `json:"name"`
	Shape      string  `json:"shape"`
	Gateway    string  `json:"gateway"`  // cilium: the cilium_host-like address
	HostLink   string  `json:"hostLink"` // cilium: the name of that host veth
	PrevResult *result `json:"prevResult"`
}

type result struct {
	CNIVersion string          `json:"cniVersion"`
	Interfaces []iface         `json:"interfaces,omitempty"`
	IPs        []ipConfig      `json:"ips,omitempty"`
	Routes     []route         `json:"routes,omitempty"`
	DNS        json.RawMessage `json:"dns,omitempty"`
}

type iface struct {
	Name    string `json:"name"`
	Mac     string `json:"mac,omitempty"`
	Sandbox string `json:"sandbox,omitempty"`
}

type ipConfig struct {
	Interface *int   `json:"interface,omitempty"`
	Address   string `json:"address"`
	Gateway   string `json:"gateway,omitempty"`
}

type route struct {
	Dst string `json:"dst"`
	GW  string `json:"gw,omitempty"`
}

func main() {
	if err := run(); err != nil {
		b, _ := json.Marshal(map[string]any{"cniVersion": "1.0.0", "code": 999, "msg": err.Error()})
		os.Stdout.Write(b)
		os.Exit(1)
	}
}

func run() error {
	cmd := os.Getenv("CNI_COMMAND")
	if cmd == "VERSION" {
		fmt.Println(`{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}`)
		return nil
	}
	in, err := io.ReadAll(os.Stdin)
	if err != nil {
		return err
	}
	var c config
	if err := json.Unmarshal(in, &c); err != nil {
		return fmt.Errorf("parse config: %w", err)
	}
	switch cmd {
	case "ADD":
		if c.PrevResult == nil {
			return errors.New("kvm-cni-shape is a chained plugin: no prevResult")
		}
		r, err := add(&c, os.Getenv("CNI_NETNS"), os.Getenv("CNI_IFNAME"), os.Getenv("CNI_CONTAINERID"))
		if err != nil {
			return err
		}
		r.CNIVersion = c.CNIVersion
		return json.NewEncoder(os.Stdout).Encode(r)
	case "DEL":
		if c.Shape == "net1" {
			return delLink(hostVeth(os.Getenv("CNI_CONTAINERID")))
		}
		return nil
	case "CHECK", "GC", "STATUS":
		return nil
	}
	return fmt.Errorf("unknown CNI_COMMAND %q", cmd)
}

func add(c *config, nsPath, ifName, id string) (*result, error) {
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", nsPath, err)
	}
	defer ns.Close()
	pod, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, err
	}
	defer pod.Close()
	r := c.PrevResult
	switch c.Shape {
	case "calico":
		return r, reshapeRouted(pod, r, ifName, net.ParseIP(calicoGW4), true)
	case "cilium":
		if err := ensureCiliumHost(c.HostLink, c.Gateway); err != nil {
			return nil, err
		}
		return r, reshapeRouted(pod, r, ifName, net.ParseIP(c.Gateway), false)
	case "net1":
		return r, addNet1(podNetns{handle: pod, ns: ns, path: nsPath}, r, ifName, id)
	}
	return nil, fmt.Errorf("unknown shape %q", c.Shape)
}

// podAndHost finds the pod's interface and the host veth in the result.
func podAndHost(r *result, ifName string) (podIdx, hostIdx int, err error) {
	podIdx, hostIdx = -1, -1
	for i, f := range r.Interfaces {
		switch {
		case f.Sandbox != "" && f.Name == ifName:
			podIdx = i
		case f.Sandbox == "":
			hostIdx = i
		}
	}
	if podIdx < 0 || hostIdx < 0 {
		return 0, 0, fmt.Errorf("prevResult lacks the pod's %s or the host veth: %+v", ifName, r.Interfaces)
	}
	return podIdx, hostIdx, nil
}

// reshapeRouted gives the pod /32 and /128 addresses, an on-link route to
// gw4 and the IPv4 default route via it; with calico also the IPv6
// default route via calicoGW6 on the host veth, and proxy ARP there.
func reshapeRouted(pod *netlink.Handle, r *result, ifName string, gw4 net.IP, calico bool) error {
	podIdx, hostIdx, err := podAndHost(r, ifName)
	if err != nil {
		return err
	}
	l, err := pod.LinkByName(ifName)
	if err != nil {
		return err
	}
	host, err := netlink.LinkByName(r.Interfaces[hostIdx].Name)
	if err != nil {
		return err
	}
	// Routes first (they go with the addresses anyway), then addresses.
	routes, err := pod.RouteList(l, unix.AF_UNSPEC)
	if err != nil {
		return err
	}
	for _, rt := range routes {
		if rt.Protocol != unix.RTPROT_KERNEL {
			_ = pod.RouteDel(&rt)
		}
	}
	var ips []ipConfig
	has6 := false
	for _, ipc := range r.IPs {
		a, is6, err := hostAddress(pod, l, ipc.Address, calico)
		if err != nil {
			return err
		}
		gw := gw4.String()
		if is6 {
			gw, has6 = calicoGW6, true
		}
		ips = append(ips, ipConfig{Interface: &podIdx, Address: a.IPNet.String(), Gateway: gw})
	}
	if err := pod.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: &net.IPNet{IP: gw4, Mask: net.CIDRMask(32, 32)},
		Scope: netlink.SCOPE_LINK}); err != nil {
		return fmt.Errorf("on-link route to %s: %w", gw4, err)
	}
	if err := pod.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw4}); err != nil {
		return fmt.Errorf("default route via %s: %w", gw4, err)
	}
	r.Routes = []route{{Dst: "0.0.0.0/0", GW: gw4.String()}}
	if calico {
		if err := sysctl(filepath.Join("net/ipv4/conf", host.Attrs().Name, "proxy_arp"), "1"); err != nil {
			return err
		}
		if err := sysctl(filepath.Join("net/ipv4/neigh", host.Attrs().Name, "proxy_delay"), "0"); err != nil {
			return err
		}
	}
	if has6 {
		mac, _ := net.ParseMAC(calicoMAC)
		if err := netlink.LinkSetHardwareAddr(host, mac); err != nil {
			return err
		}
		ll := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(calicoGW6), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}
		if err := netlink.AddrAdd(host, ll); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("add %s to %s: %w", calicoGW6, host.Attrs().Name, err)
		}
		r.Interfaces[hostIdx].Mac = calicoMAC
		if err := pod.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)},
			Gw: net.ParseIP(calicoGW6)}); err != nil {
			return fmt.Errorf("IPv6 default route via %s: %w", calicoGW6, err)
		}
		r.Routes = append(r.Routes, route{Dst: "::/0", GW: calicoGW6})
	}
	r.IPs = ips
	return nil
}

// hostAddress replaces the address cidr on the pod's link l with the same
// address as a host route (/32 or /128) and returns it; is6 for IPv6,
// which only the calico shape has.
func hostAddress(pod *netlink.Handle, l netlink.Link, cidr string, calico bool) (a *netlink.Addr, is6 bool, err error) {
	ip, _, err := net.ParseCIDR(cidr)
	if err != nil {
		return nil, false, err
	}
	bits := 32
	if ip.To4() == nil {
		bits, is6 = 128, true
		if !calico {
			return nil, false, errors.New("the cilium shape here is IPv4 only")
		}
	}
	old, err := netlink.ParseAddr(cidr)
	if err != nil {
		return nil, false, err
	}
	if err := pod.AddrDel(l, old); err != nil {
		return nil, false, fmt.Errorf("remove %s: %w", cidr, err)
	}
	a = &netlink.Addr{IPNet: &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)}, Flags: unix.IFA_F_NODAD}
	if err := pod.AddrAdd(l, a); err != nil {
		return nil, false, fmt.Errorf("add %s: %w", a.IPNet, err)
	}
	return a, is6, nil
}

// ensureCiliumHost makes the host-side veth pair that carries the pods'
// gateway address, as Cilium's cilium_host and cilium_net do.
func ensureCiliumHost(name, gw string) error {
	if name == "" || net.ParseIP(gw) == nil {
		return fmt.Errorf("cilium shape needs hostLink and gateway, got %q %q", name, gw)
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		if err = netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "n"}); err != nil &&
			!errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("add %s: %w", name, err)
		}
		if l, err = netlink.LinkByName(name); err != nil {
			return err
		}
	}
	a := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(gw), Mask: net.CIDRMask(32, 32)}}
	if err := netlink.AddrAdd(l, a); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add %s to %s: %w", gw, name, err)
	}
	if peer, err := netlink.LinkByName(name + "n"); err == nil {
		_ = netlink.LinkSetUp(peer)
	}
	return netlink.LinkSetUp(l)
}

// hostVeth names the host end of a pod's net1.
func hostVeth(containerID string) string {
	sum := sha256.Sum256([]byte(containerID))
	return "kvmn1" + hex.EncodeToString(sum[:])[:8]
}

// podNetns is the pod's network namespace: a netlink handle in it, the
// namespace itself, and its path.
type podNetns struct {
	handle *netlink.Handle
	ns     netns.NsHandle
	path   string
}

// addNet1 adds the second interface net1, as Multus would, to the pod of
// container id whose first interface is ifName.
func addNet1(p podNetns, r *result, ifName, id string) error {
	pod, ns, nsPath := p.handle, p.ns, p.path
	var v4 net.IP
	for _, ipc := range r.IPs {
		if ip, _, err := net.ParseCIDR(ipc.Address); err == nil && ip.To4() != nil {
			v4 = ip.To4()
		}
	}
	if v4 == nil {
		return fmt.Errorf("net1 needs an IPv4 address on %s", ifName)
	}
	name := hostVeth(id)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: "net1", PeerNamespace: netlink.NsFd(ns)}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s/net1: %w", name, err)
	}
	host, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	hostAddr := &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 90, v4[2], 254), Mask: net.CIDRMask(24, 32)}}
	if err = netlink.AddrAdd(host, hostAddr); err != nil {
		return err
	}
	if err = netlink.LinkSetUp(host); err != nil {
		return err
	}
	l, err := pod.LinkByName("net1")
	if err != nil {
		return err
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 90, v4[2], v4[3]), Mask: net.CIDRMask(24, 32)}}
	if err := pod.AddrAdd(l, addr); err != nil {
		return err
	}
	if err := pod.LinkSetUp(l); err != nil {
		return err
	}
	idx := len(r.Interfaces) + 1
	r.Interfaces = append(r.Interfaces, iface{Name: name, Mac: host.Attrs().HardwareAddr.String()},
		iface{Name: "net1", Mac: l.Attrs().HardwareAddr.String(), Sandbox: nsPath})
	r.IPs = append(r.IPs, ipConfig{Interface: &idx, Address: addr.IPNet.String()})
	return nil
}

func delLink(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return nil // gone
	}
	return netlink.LinkDel(l)
}

func sysctl(key, value string) error {
	return os.WriteFile(filepath.Join("/proc/sys", key), []byte(value), 0o644)
}
