package shim

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/kvm-shim/containerd-shim-kvm-v1/netfd"
)

func iface(name, mac string, addrs []string, routes ...netfd.Route) netfd.Interface {
	hw, _ := net.ParseMAC(mac)
	i := netfd.Interface{Name: name, MAC: hw, MTU: 1500, Routes: routes}
	for _, a := range addrs {
		i.Addrs = append(i.Addrs, netip.MustParsePrefix(a))
	}
	return i
}

func route(dst, gw string) netfd.Route {
	r := netfd.Route{Dst: netip.MustParsePrefix(dst)}
	if gw != "" {
		r.Gateway = netip.MustParseAddr(gw)
	}
	return r
}

// ip= is given only where it says the whole network.
func TestIPKernelArg(t *testing.T) {
	dns := []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00::a")}
	bridge := iface("eth0", "02:00:00:00:00:01", []string{"10.88.0.5/24"}, route("0.0.0.0/0", "10.88.0.1"))
	cases := []struct {
		name string
		pn   netfd.PodNetwork
		arg  string // "" for none
		why  string
	}{
		{"bridge", netfd.PodNetwork{Interfaces: []netfd.Interface{bridge}}, "ip=10.88.0.5::10.88.0.1:255.255.255.0:vm::off:10.96.0.10", ""},
		{"calico", netfd.PodNetwork{Interfaces: []netfd.Interface{iface("eth0", "02:00:00:00:00:01", []string{"10.88.0.5/32"},
			route("169.254.1.1/32", ""), route("0.0.0.0/0", "169.254.1.1"))}}, "", "route 169.254.1.1/32 on-link"},
		{"cilium gateway outside", netfd.PodNetwork{Interfaces: []netfd.Interface{iface("eth0", "02:00:00:00:00:01", []string{"10.88.0.5/32"},
			route("0.0.0.0/0", "10.99.0.1"))}}, "", "gateway 10.99.0.1 of eth0 is outside 10.88.0.5/32"},
		{"ipv6", netfd.PodNetwork{Interfaces: []netfd.Interface{iface("eth0", "02:00:00:00:00:01", []string{"10.88.0.5/24", "fd00::5/64"})}}, "",
			"IPv6 address fd00::5/64"},
		{"two interfaces", netfd.PodNetwork{Interfaces: []netfd.Interface{bridge, iface("net1", "02:00:00:00:00:02", []string{"10.89.0.5/24"})}},
			"", "2 interfaces"},
	}
	for _, c := range cases {
		arg, why, ok := ipKernelArg(c.pn, dns, "vm")
		if arg != c.arg || ok != (c.arg != "") || !strings.Contains(why, c.why) {
			t.Errorf("%s: ip= %q, %q, %v; want %q, %q", c.name, arg, why, ok, c.arg, c.why)
		}
	}
}

// Each pod interface becomes a link in interface order; an on-link route
// goes to the drive via the unspecified address of its family.
func TestDriveNetwork(t *testing.T) {
	pn := netfd.PodNetwork{Interfaces: []netfd.Interface{
		iface("eth0", "02:00:00:00:00:01", []string{"10.88.0.5/32", "fd00::5/128"},
			route("169.254.1.1/32", ""), route("fd00::1/128", ""), route("0.0.0.0/0", "169.254.1.1"), route("::/0", "fd00::1")),
		iface("net1", "02:00:00:00:00:02", []string{"10.89.0.5/24"}),
	}}
	n, err := driveNetwork(pn, []netip.Addr{netip.MustParseAddr("10.96.0.10")}, []string{"cluster.local"})
	if err != nil {
		t.Fatal(err)
	}
	if len(n.Links) != 2 || n.Links[0].ID != "interface0" || n.Links[1].MAC.String() != "02:00:00:00:00:02" || len(n.Networks) != 3 {
		t.Fatalf("links %+v networks %+v", n.Links, n.Networks)
	}
	var got []string
	for _, nt := range n.Networks {
		for _, r := range nt.Routes {
			got = append(got, nt.Link+" "+r.Dst.String()+" "+r.Gateway.String())
		}
	}
	want := "interface0 169.254.1.1/32 0.0.0.0,interface0 0.0.0.0/0 169.254.1.1,interface0 fd00::1/128 ::,interface0 ::/0 fd00::1"
	if strings.Join(got, ",") != want {
		t.Errorf("routes %s\nwant   %s", strings.Join(got, ","), want)
	}
}

func TestNetQueues(t *testing.T) {
	for _, c := range []struct {
		vcpus, max, nics int
		vhost            bool
		want             int
	}{
		{4, 4, 1, true, 4}, {8, 4, 2, false, 4}, {1, 4, 8, true, 1}, {64, 64, 8, true, 15}, {64, 64, 8, false, 31},
	} {
		if got := netQueues(c.vcpus, c.max, c.nics, c.vhost); got != c.want {
			t.Errorf("netQueues(%d vcpus, max %d, %d NICs, vhost %v) = %d, want %d", c.vcpus, c.max, c.nics, c.vhost, got, c.want)
		}
	}
}

func TestTAPName(t *testing.T) {
	key := "0123456789abcdef"
	if a, b := tapName(key, 0), tapName(key, 7); a != "kvmtap01234567" || b != "kvmtap012345677" || len(b) > 15 {
		t.Errorf("TAP names %q %q", a, b)
	}
}
