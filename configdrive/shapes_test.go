package configdrive

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

const testMAC2 = "52:54:00:ab:cd:ef"

// calicoNetwork is a pod as Calico and Multus shape it: eth0 with a /32
// and a /128, an on-link route to the link-local gateway 169.254.1.1 and
// the default routes via it and via a link-local IPv6 gateway; net1 with
// an address on a subnet of its own and no default route.
func calicoNetwork(t *testing.T) *Network {
	t.Helper()
	n := &Network{DNS: []netip.Addr{netip.MustParseAddr("10.96.0.10")}, Search: []string{"svc.cluster.local"}}
	err := n.AddLink(mustMAC(testMAC), 1440,
		[]netip.Prefix{netip.MustParsePrefix("10.244.7.9/32"), netip.MustParsePrefix("fd00:10:244::7:9/128")},
		[]Route{
			{Dst: netip.MustParsePrefix("169.254.1.1/32"), Gateway: netip.IPv4Unspecified()},
			{Dst: netip.MustParsePrefix("0.0.0.0/0"), Gateway: netip.MustParseAddr("169.254.1.1")},
			{Dst: netip.MustParsePrefix("::/0"), Gateway: netip.MustParseAddr("fe80::ecee:eeff:feee:eeee")},
		})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.AddLink(mustMAC(testMAC2), 1500, []netip.Prefix{netip.MustParsePrefix("192.168.77.9/24")}, nil); err != nil {
		t.Fatal(err)
	}
	return n
}

func mustMAC(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

func TestGuestNetworkFile(t *testing.T) {
	b, err := renderGuestNetwork(calicoNetwork(t))
	if err != nil {
		t.Fatal(err)
	}
	want := `# guest network, from containerd-shim-kvm-v1 (the same as openstack/latest/network_data.json)
link 52:54:00:12:34:56 1440
link 52:54:00:ab:cd:ef 1500
addr 52:54:00:12:34:56 10.244.7.9/32
addr 52:54:00:12:34:56 fd00:10:244::7:9/128
addr 52:54:00:ab:cd:ef 192.168.77.9/24
route 52:54:00:12:34:56 169.254.1.1/32 onlink
route 52:54:00:12:34:56 0.0.0.0/0 169.254.1.1
route 52:54:00:12:34:56 ::/0 fe80::ecee:eeff:feee:eeee
dns 10.96.0.10
search svc.cluster.local
`
	if string(b) != want {
		t.Errorf("got:\n%s\nwant:\n%s", b, want)
	}
}

// Two links keep their ids in order, and the on-link route to the
// gateway is in network_data.json as a route via 0.0.0.0.
func TestNetworkDataShapes(t *testing.T) {
	b, err := renderNetworkData(calicoNetwork(t))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, want := range []string{`"id": "interface0"`, `"id": "interface1"`, `"ethernet_mac_address": "52:54:00:ab:cd:ef"`,
		`"network": "169.254.1.1",
          "netmask": "255.255.255.255",
          "gateway": "0.0.0.0"`, `"gateway": "fe80::ecee:eeff:feee:eeee"`, `"link": "interface1"`} {
		if !strings.Contains(s, want) {
			t.Errorf("network_data.json lacks %s:\n%s", want, s)
		}
	}
}

func TestNetworkRefuses(t *testing.T) {
	n := calicoNetwork(t)
	if err := n.AddLink(mustMAC(testMAC), 1500, []netip.Prefix{netip.MustParsePrefix("192.168.78.9/24")},
		nil); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "same MAC") {
		t.Errorf("a second link with the same MAC: %v", err)
	}
	if len(n.Links) != 2 || len(n.Networks) != 3 {
		t.Errorf("a refused link was kept: %d links, %d networks", len(n.Links), len(n.Networks))
	}
	err := n.AddLink(mustMAC("52:54:00:00:00:03"), 1500, []netip.Prefix{netip.MustParsePrefix("192.168.79.9/24")},
		[]Route{{Dst: netip.MustParsePrefix("::/0"), Gateway: netip.MustParseAddr("fe80::1")}})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "no address of the route's family") {
		t.Errorf("an IPv6 route on an IPv4-only link: %v", err)
	}
}

// Debian's cloud-init renders the Calico shape so that the guest's kernel
// can take it: the on-link route comes first, without a usable gateway
// (systemd-networkd gives a route with Gateway=0.0.0.0 link scope), then
// the default route via 169.254.1.1; the second NIC gets its address.
func TestCloudInitNetConvertShapes(t *testing.T) {
	requireCloudInit(t)
	b, err := renderNetworkData(calicoNetwork(t))
	if err != nil {
		t.Fatal(err)
	}
	nd := filepath.Join(t.TempDir(), "network_data.json")
	if err := os.WriteFile(nd, b, 0o644); err != nil {
		t.Fatal(err)
	}
	files := netConvert(t, nd, "networkd", "eth1,"+testMAC2)
	eth0 := files["etc/systemd/network/10-cloud-init-eth0.network"]
	t.Logf("networkd eth0:\n%s", eth0)
	onLink := strings.Index(eth0, "Destination=169.254.1.1/32")
	def := strings.Index(eth0, "Destination=0.0.0.0/0")
	if onLink < 0 || def < onLink || !containsLine(eth0, "Gateway=169.254.1.1") || !containsLine(eth0, "Gateway=fe80::ecee:eeff:feee:eeee") ||
		!containsLine(eth0, "Address=10.244.7.9/32") || !containsLine(eth0, "Address=fd00:10:244::7:9/128") {
		t.Errorf("networkd config of eth0 is not the Calico shape")
	}
	eth1 := files["etc/systemd/network/10-cloud-init-eth1.network"]
	if !containsLine(eth1, "Address=192.168.77.9/24") || !containsLine(eth1, "MACAddress="+testMAC2) {
		t.Errorf("networkd config of eth1:\n%s", eth1)
	}
}
