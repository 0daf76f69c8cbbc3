package netfd

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

var nsCount int

// podNetns makes a fresh named network namespace for one test, with the
// links that setup adds, and removes it afterwards.
func podNetns(t *testing.T, setup func(h *netlink.Handle) error) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces")
	}
	nsCount++
	name := fmt.Sprintf("kvmshim-test-%d-%d", os.Getpid(), nsCount)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		origin, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		ns, err := netns.NewNamed(name)
		if err != nil {
			errc <- err
			return
		}
		ns.Close()
		if err := netns.Set(origin); err != nil {
			errc <- err // thread stays locked and dies
			return
		}
		runtime.UnlockOSThread()
		errc <- nil
	}()
	if err := <-errc; err != nil {
		t.Fatalf("create netns: %v", err)
	}
	t.Cleanup(func() { _ = netns.DeleteNamed(name) })
	path := filepath.Join("/var/run/netns", name)
	if setup != nil {
		if err := inNetns(path, setup); err != nil {
			t.Fatal(err)
		}
	}
	return path
}

// cniLike adds what a CNI plugin leaves: a veth eth0 (its peer in a
// namespace of its own) with an address, up, and a default route.
func cniLike(t *testing.T, name, mac string) func(h *netlink.Handle) error {
	return addVeth(t, name, mac, []string{"10.77.0.5/24"}, &netlink.Route{Gw: net.ParseIP("10.77.0.1")})
}

func TestInspect(t *testing.T) {
	path := podNetns(t, cniLike(t, "eth0", "02:42:0a:4d:00:05"))
	pn, err := Inspect(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(pn.Interfaces) != 1 {
		t.Fatalf("got %+v", pn)
	}
	ifc := pn.Interfaces[0]
	if ifc.Name != "eth0" || ifc.MAC.String() != "02:42:0a:4d:00:05" || ifc.MTU != 1450 {
		t.Errorf("got %+v", ifc)
	}
	if len(ifc.Addrs) != 1 || ifc.Addrs[0] != netip.MustParsePrefix("10.77.0.5/24") {
		t.Errorf("addrs %v", ifc.Addrs)
	}
	// The kernel's prefix route 10.77.0.0/24 is left to the guest's kernel.
	if gw, ok := ifc.DefaultGateway(true); !ok || gw != netip.MustParseAddr("10.77.0.1") || len(ifc.Routes) != 1 {
		t.Errorf("gateway %v %v (routes %v)", gw, ok, ifc.Routes)
	}
}

// addVeth adds a veth name (MTU 1450, its peer in a namespace of its own)
// with mac and addrs, up, and the routes, to the namespace of h.
func addVeth(t *testing.T, name, mac string, addrs []string, routes ...*netlink.Route) func(h *netlink.Handle) error {
	peerNS := podNetns(t, nil)
	return func(h *netlink.Handle) error {
		hw, _ := net.ParseMAC(mac)
		peer, err := netns.GetFromPath(peerNS)
		if err != nil {
			return err
		}
		defer peer.Close()
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: 1450, HardwareAddr: hw}, PeerName: "peer0",
			PeerNamespace: netlink.NsFd(peer)}
		if err = h.LinkAdd(veth); err != nil {
			return err
		}
		l, err := h.LinkByName(name)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			addr, err := netlink.ParseAddr(a)
			if err != nil {
				return err
			}
			addr.Flags = unix.IFA_F_NODAD
			if err := h.AddrAdd(l, addr); err != nil {
				return fmt.Errorf("add %s: %w", a, err)
			}
		}
		if err := h.LinkSetUp(l); err != nil {
			return err
		}
		for _, r := range routes {
			r.LinkIndex = l.Attrs().Index
			if err := h.RouteAdd(r); err != nil {
				return fmt.Errorf("add route %v: %w", r, err)
			}
		}
		return nil
	}
}

func ipNet(s string) *net.IPNet {
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	return n
}

// Calico's shape (a /32 and a /128, an on-link route to 169.254.1.1, the
// default routes via it and via a link-local IPv6 gateway) on eth0, and
// Multus-style net1 and net10 with addresses of their own: Inspect keeps
// interface order and every route the guest needs.
func TestInspectShapes(t *testing.T) {
	path := podNetns(t, func(h *netlink.Handle) error {
		steps := []func(h *netlink.Handle) error{
			addVeth(t, "net10", "02:00:00:00:00:0a", []string{"192.168.10.2/24"}),
			addVeth(t, "eth0", "02:00:00:00:00:01", []string{"10.77.0.5/32", "fd00:77::5/128"},
				&netlink.Route{Dst: ipNet("169.254.1.1/32"), Scope: netlink.SCOPE_LINK},
				&netlink.Route{Gw: net.ParseIP("169.254.1.1")},
				&netlink.Route{Dst: ipNet("::/0"), Gw: net.ParseIP("fe80::ecee:eeff:feee:eeee")}),
			addVeth(t, "net1", "02:00:00:00:00:02", []string{"192.168.1.2/24"},
				&netlink.Route{Dst: ipNet("192.168.0.0/16"), Gw: net.ParseIP("192.168.1.1")}),
			// ptp's shape: the prefix route replaced by one via the gateway.
			addVeth(t, "net2", "02:00:00:00:00:03", []string{"192.168.2.2/24"}),
			func(h *netlink.Handle) error {
				l, _ := h.LinkByName("net2")
				if err := h.RouteDel(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: ipNet("192.168.2.0/24"), Scope: netlink.SCOPE_LINK,
					Protocol: unix.RTPROT_KERNEL}); err != nil {
					return fmt.Errorf("delete prefix route: %w", err)
				}
				if err := h.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: ipNet("192.168.2.1/32"), Scope: netlink.SCOPE_LINK}); err != nil {
					return err
				}
				return h.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: ipNet("192.168.2.0/24"), Gw: net.ParseIP("192.168.2.1")})
			},
		}
		for _, step := range steps {
			if err := step(h); err != nil {
				return err
			}
		}
		return nil
	})
	pn, err := Inspect(path)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, i := range pn.Interfaces {
		names = append(names, i.Name)
	}
	if got := strings.Join(names, " "); got != "eth0 net1 net2 net10" {
		t.Fatalf("interfaces %q, want eth0 net1 net2 net10", got)
	}
	eth0 := pn.Interfaces[0]
	want := []Route{
		{Dst: netip.MustParsePrefix("169.254.1.1/32")},
		{Dst: netip.MustParsePrefix("0.0.0.0/0"), Gateway: netip.MustParseAddr("169.254.1.1")},
		{Dst: netip.MustParsePrefix("::/0"), Gateway: netip.MustParseAddr("fe80::ecee:eeff:feee:eeee")},
	}
	if !slices.Equal(eth0.Routes, want) {
		t.Errorf("eth0 routes %v, want %v", eth0.Routes, want)
	}
	if !slices.Equal(eth0.Addrs, []netip.Prefix{netip.MustParsePrefix("10.77.0.5/32"), netip.MustParsePrefix("fd00:77::5/128")}) {
		t.Errorf("eth0 addrs %v", eth0.Addrs)
	}
	if r := pn.Interfaces[1].Routes; len(r) != 1 || r[0].Dst != netip.MustParsePrefix("192.168.0.0/16") {
		t.Errorf("net1 routes %v", r)
	}
	if ptp := pn.Interfaces[2]; len(ptp.Addrs) != 1 || ptp.Addrs[0] != netip.MustParsePrefix("192.168.2.2/32") || len(ptp.Routes) != 2 {
		t.Errorf("net2 (ptp) %v %v, want 192.168.2.2/32 (its prefix is not on-link) with both routes", ptp.Addrs, ptp.Routes)
	}
	if len(pn.Interfaces[3].Routes) != 0 || pn.Interfaces[3].Addrs[0].Bits() != 24 {
		t.Errorf("net10 %v routes %v, want its /24 and no route (its prefix route is the kernel's)", pn.Interfaces[3].Addrs,
			pn.Interfaces[3].Routes)
	}
	// The same network is the same; another address is a change.
	again, err := Inspect(path)
	if err != nil || again.SameAs(pn) != nil {
		t.Errorf("inspected twice: %v, %v", err, again.SameAs(pn))
	}
	if err = inNetns(path, func(h *netlink.Handle) error {
		l, _ := h.LinkByName("net1")
		a, _ := netlink.ParseAddr("192.168.1.3/24")
		return h.AddrAdd(l, a)
	}); err != nil {
		t.Fatal(err)
	}
	changed, err := Inspect(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := changed.SameAs(pn); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "192.168.1.3/24") {
		t.Errorf("an address added since: %v", err)
	}
}

func TestInspectErrors(t *testing.T) {
	if _, err := Inspect("/var/run/netns/does-not-exist"); !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "does-not-exist") {
		t.Errorf("missing netns: %v", err)
	}
	empty := podNetns(t, nil)
	if _, err := Inspect(empty); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "no CNI interface") {
		t.Errorf("no interface: %v", err)
	}
	cases := map[string]struct {
		setup func(h *netlink.Handle) error
		want  string
	}{
		"no address": {addVeth(t, "eth0", "02:00:00:00:00:01", nil), "interface eth0 has no IP address"},
		"L3 device": {func(h *netlink.Handle) error {
			tun := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: "tun0"}, Mode: netlink.TUNTAP_MODE_TUN}
			if err := h.LinkAdd(tun); err != nil {
				return err
			}
			closeFiles(tun.Fds)
			return nil
		}, "interface tun0 (tuntap, link type none) has no Ethernet address"},
		"no ARP": {func(h *netlink.Handle) error {
			if err := addVeth(t, "eth0", "02:00:00:00:00:01", []string{"10.1.0.2/24"})(h); err != nil {
				return err
			}
			l, _ := h.LinkByName("eth0")
			return h.LinkSetARPOff(l)
		}, "interface eth0 (veth) does no ARP"},
		"too many": {func(h *netlink.Handle) error {
			for i := 0; i <= MaxInterfaces; i += 2 {
				veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("net%d", i)}, PeerName: fmt.Sprintf("net%d", i+1)}
				if err := h.LinkAdd(veth); err != nil {
					return err
				}
			}
			return nil
		}, "has 10 interfaces (net0, net1, net2, net3, net4, net5, net6, net7, net8, net9); a VM takes at most 8"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			path := podNetns(t, c.setup)
			if _, err := Inspect(path); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("got %v, want InvalidArgument with %q", err, c.want)
			}
		})
	}
}

func TestCompareIfNames(t *testing.T) {
	names := []string{"net10", "net2", "eth1", "lan0", "net1", "eth0"}
	slices.SortFunc(names, compareIfNames)
	if got := strings.Join(names, " "); got != "eth0 eth1 lan0 net1 net2 net10" {
		t.Errorf("order %s", got)
	}
}

func TestTAPLifecycle(t *testing.T) {
	path := podNetns(t, cniLike(t, "eth0", "02:42:0a:4d:00:05"))
	tap := TAP{Name: TAPPrefix + "0", Queues: 2, VNetHdr: true, MTU: 1450}
	if err := CreateTAP(path, tap); err != nil {
		t.Fatal(err)
	}
	// The TAP persists without descriptors and can be reopened per queue.
	files, err := OpenQueues(path, tap, 2)
	if err != nil {
		t.Fatal(err)
	}
	closeFiles(files)
	created, err := Wire(path, "eth0", tap.Name)
	if err != nil {
		t.Fatal(err)
	}
	if !created {
		t.Error("Wire did not report creating eth0's ingress qdisc")
	}
	err = inNetns(path, func(h *netlink.Handle) error {
		l, linkByNameErr := h.LinkByName(tap.Name)
		if linkByNameErr != nil {
			return linkByNameErr
		}
		if l.Attrs().MTU != 1450 || l.Attrs().Flags&net.FlagUp == 0 {
			t.Errorf("TAP attrs %+v", l.Attrs())
		}
		for _, name := range []string{"eth0", tap.Name} {
			link, _ := h.LinkByName(name)
			fs, filterListErr := h.FilterList(link, netlink.HANDLE_MIN_INGRESS)
			if filterListErr != nil {
				return filterListErr
			}
			if len(fs) != 1 || fs[0].Attrs().Priority != filterPrio {
				t.Errorf("filters on %s: %v", name, fs)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The pod interface is the only one Inspect sees, the TAP is ignored.
	if pn, inspectErr := Inspect(path); inspectErr != nil || len(pn.Interfaces) != 1 || pn.Interfaces[0].Name != "eth0" {
		t.Errorf("inspect with TAP: %+v, %v", pn, inspectErr)
	}
	if err = Unwire(path, "eth0", tap.Name, created); err != nil {
		t.Fatal(err)
	}
	if err = DeleteTAP(path, tap.Name); err != nil {
		t.Fatal(err)
	}
	err = inNetns(path, func(h *netlink.Handle) error {
		if _, linkByNameErr := h.LinkByName(tap.Name); linkByNameErr == nil {
			t.Error("TAP still there")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	assertNoIngress(t, path)
	// Teardown twice, and of a gone namespace, is fine.
	if err := DeleteTAP(path, tap.Name); err != nil {
		t.Error(err)
	}
	if err := Unwire("/var/run/netns/gone", "eth0", tap.Name, true); err != nil {
		t.Error(err)
	}
}

func TestUnwireKeepsForeignQdisc(t *testing.T) {
	path := podNetns(t, cniLike(t, "eth0", "02:42:0a:4d:00:05"))
	err := inNetns(path, func(h *netlink.Handle) error {
		l, _ := h.LinkByName("eth0")
		return h.QdiscAdd(ingress(l))
	})
	if err != nil {
		t.Fatal(err)
	}
	tap := TAP{Name: TAPPrefix + "1", Queues: 1, MTU: 1450}
	if err = CreateTAP(path, tap); err != nil {
		t.Fatal(err)
	}
	created, err := Wire(path, "eth0", tap.Name)
	if err != nil || created {
		t.Fatalf("wire: created=%v, %v", created, err)
	}
	if err := Unwire(path, "eth0", tap.Name, created); err != nil {
		t.Fatal(err)
	}
	_ = inNetns(path, func(h *netlink.Handle) error {
		l, _ := h.LinkByName("eth0")
		qs, _ := h.QdiscList(l)
		found := false
		for _, q := range qs {
			found = found || q.Type() == "ingress"
		}
		if !found {
			t.Error("the qdisc that was there before was removed")
		}
		fs, _ := h.FilterList(l, netlink.HANDLE_MIN_INGRESS)
		if len(fs) != 0 {
			t.Errorf("our filter left: %v", fs)
		}
		return nil
	})
}

func TestDomainFromArgs(t *testing.T) {
	cases := map[string][]string{
		"kvm-a-b-1": {"-name", "guest=kvm-a-b-1,debug-threads=on", "-S"},
		"a,b":       {"-name", "guest=a,,b,debug-threads=on"},
		"legacy":    {"-name", "legacy"},
		"":          {"-machine", "none", "-qmp", "unix:/x"},
	}
	for want, args := range cases {
		if got := DomainFromArgs(args); got != want {
			t.Errorf("%v: got %q, want %q", args, got, want)
		}
	}
}

func TestGrantArgs(t *testing.T) {
	g := Grant{NICs: []NIC{{NetdevID: "kvmnet0", MAC: "02:42:0a:4d:00:05", Bus: "pcie.0", Addr: "0x10", Queues: 2, VhostFDs: 2}}}
	got := strings.Join(g.QEMUArgs([]int{3, 4, 5, 6}), " ")
	want := "-netdev tap,id=kvmnet0,fds=3:4,vhost=on,vhostfds=5:6 -device " +
		"virtio-net-pci,netdev=kvmnet0,id=kvmnet0-dev,mac=02:42:0a:4d:00:05,bus=pcie.0,addr=0x10,mq=on,vectors=6"
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	g.NICs[0].Queues, g.NICs[0].VhostFDs = 1, 0
	if got := strings.Join(g.QEMUArgs([]int{3}), " "); strings.Contains(got, "vhost") || strings.Contains(got, "mq=on") {
		t.Errorf("single queue without vhost: %s", got)
	}
}

// podRedirectTargets names the links eth0's redirects of ours go to.
func podRedirectTargets(t *testing.T, path string) []string {
	t.Helper()
	var names []string
	err := inNetns(path, func(h *netlink.Handle) error {
		l, err := h.LinkByName("eth0")
		if err != nil {
			return err
		}
		rs, err := ourRedirects(h, l)
		if err != nil {
			return err
		}
		for _, r := range rs {
			name := "gone"
			if to, err := h.LinkByIndex(r.target); err == nil {
				name = to.Attrs().Name
			}
			names = append(names, name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// A pod's network serves one VM: a second VM's Wire is refused and its
// teardown leaves the first VM's redirect alone.
func TestWireOneVMPerPod(t *testing.T) {
	path := podNetns(t, cniLike(t, "eth0", "02:42:0a:4d:00:05"))
	first := TAP{Name: TAPPrefix + "a", Queues: 1, MTU: 1450}
	second := TAP{Name: TAPPrefix + "b", Queues: 1, MTU: 1450}
	for _, tap := range []TAP{first, second} {
		if err := CreateTAP(path, tap); err != nil {
			t.Fatal(err)
		}
	}
	created, err := Wire(path, "eth0", first.Name)
	if err != nil || !created {
		t.Fatalf("first VM: created %v, %v", created, err)
	}
	createdAgain, err := Wire(path, "eth0", second.Name)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), first.Name) || createdAgain {
		t.Errorf("second VM: created %v, %v; want FailedPrecondition naming %s", createdAgain, err, first.Name)
	}
	unwireLeaves(t, path, second.Name, createdAgain, first.Name)
	unwireLeaves(t, path, first.Name, created)
	assertNoIngress(t, path)
}

// unwireLeaves unwires tap from eth0 and checks which redirects are left.
func unwireLeaves(t *testing.T, path, tap string, created bool, want ...string) {
	t.Helper()
	if err := Unwire(path, "eth0", tap, created); err != nil {
		t.Fatal(err)
	}
	if got := podRedirectTargets(t, path); !slices.Equal(got, want) {
		t.Errorf("after unwiring %s eth0 redirects to %v, want %v", tap, got, want)
	}
}

// assertNoIngress checks that eth0 is as CNI made it: no ingress qdisc.
func assertNoIngress(t *testing.T, path string) {
	t.Helper()
	err := inNetns(path, func(h *netlink.Handle) error {
		l, err := h.LinkByName("eth0")
		if err != nil {
			return err
		}
		qs, err := h.QdiscList(l)
		if err != nil {
			return err
		}
		for _, q := range qs {
			if q.Type() == "ingress" {
				t.Error("ingress qdisc left on eth0")
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A shim that died left its redirect to a TAP that is gone: the next VM
// of the pod takes the network, and the late teardown of the dead one
// (whose TAP is gone) leaves the new VM's redirect and qdisc in place.
func TestWireReplacesStaleRedirect(t *testing.T) {
	path := podNetns(t, cniLike(t, "eth0", "02:42:0a:4d:00:05"))
	old := TAP{Name: TAPPrefix + "old", Queues: 1, MTU: 1450}
	if err := CreateTAP(path, old); err != nil {
		t.Fatal(err)
	}
	oldCreated, err := Wire(path, "eth0", old.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err = DeleteTAP(path, old.Name); err != nil {
		t.Fatal(err)
	}
	if got := podRedirectTargets(t, path); len(got) != 1 || got[0] != "gone" {
		t.Fatalf("stale redirect: %v", got)
	}
	next := TAP{Name: TAPPrefix + "new", Queues: 1, MTU: 1450}
	if err = CreateTAP(path, next); err != nil {
		t.Fatal(err)
	}
	nextCreated, err := Wire(path, "eth0", next.Name)
	if err != nil {
		t.Fatalf("next VM: %v", err)
	}
	if !nextCreated {
		t.Error("the next VM did not take over the dead one's qdisc")
	}
	unwireLeaves(t, path, old.Name, oldCreated, next.Name)
	// When the next VM goes, eth0 is as CNI made it.
	unwireLeaves(t, path, next.Name, nextCreated)
	assertNoIngress(t, path)
}
