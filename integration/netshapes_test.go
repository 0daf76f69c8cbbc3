//go:build integration

package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// cniShape is a pod network as one of the main CNIs builds it, made here
// from Debian's plugins and hack/cni-shape. k is the flavour's index, so
// the two containerds' networks never meet.
type cniShape struct {
	name string
	// plugins is the plugin chain (JSON objects, comma-separated) with
	// IPAM data in ipamDir.
	plugins func(k int, ipamDir string) string
	// gw4, gw6: the guest's default gateways ("" none).
	gw4, gw6 func(k int) string
	// nics is how many interfaces the pod has.
	nics int
	// gw4Silent: nobody holds the IPv4 gateway (Calico's 169.254.1.1 is
	// answered by proxy ARP, never by ping), so the guest's ping of it
	// fails; its default route is proven by reaching the host.
	gw4Silent bool
	// hostLinks: what the shape leaves on the host (bridges, the
	// cilium_host-like veth), removed when the test ends.
	hostLinks func(k int) []string
	// badInput: try the network's bad inputs on this shape's pod.
	badInput bool
}

func none(int) string { return "" }

// canon writes an address as Go and ip print it (fd92:0::1 is fd92::1).
func canon(addr string) string {
	if a, err := netip.ParseAddr(addr); err == nil {
		return a.String()
	}
	return addr
}

func ptpPlugin(k int, ipamDir string, v6 bool) string {
	ranges := fmt.Sprintf(`[{"subnet": "10.91.%d.0/24"}]`, k)
	routes := `{"dst": "0.0.0.0/0"}`
	if v6 {
		ranges += fmt.Sprintf(`, [{"subnet": "fd91:%d::/64"}]`, k)
		routes += `, {"dst": "::/0"}`
	}
	return fmt.Sprintf(`{"type": "ptp", "ipMasq": false, "ipam": {"type": "host-local", "dataDir": %q, "ranges": [%s], "routes": [%s]}}`,
		ipamDir, ranges, routes)
}

func bridgePlugin(name, ipamDir string, subnets ...string) string {
	var ranges []string
	for _, s := range subnets {
		ranges = append(ranges, fmt.Sprintf(`[{"subnet": %q}]`, s))
	}
	return fmt.Sprintf(`{"type": "bridge", "bridge": %q, "isGateway": true, "isDefaultGateway": true, "ipMasq": false, `+
		`"ipam": {"type": "host-local", "dataDir": %q, "ranges": [%s]}}`,
		name, ipamDir, strings.Join(ranges, ", "))
}

var cniShapes = []cniShape{
	{
		name:    "ptp",
		plugins: func(k int, d string) string { return ptpPlugin(k, d, false) },
		gw4:     func(k int) string { return fmt.Sprintf("10.91.%d.1", k) }, gw6: none,
		nics: 1,
	},
	{
		// Calico, dual-stack, with a second interface as Multus adds one.
		name: "calico",
		plugins: func(k int, d string) string {
			return ptpPlugin(k, d, true) + `, {"type": "kvm-cni-shape", "shape": "calico"}, {"type": "kvm-cni-shape", "shape": "net1"}`
		},
		gw4:       func(int) string { return "169.254.1.1" },
		gw6:       func(int) string { return "fe80::ecee:eeff:feee:eeee" },
		nics:      2,
		gw4Silent: true,
		badInput:  true,
	},
	{
		name: "cilium",
		plugins: func(k int, d string) string {
			return ptpPlugin(k, d, false) +
				fmt.Sprintf(`, {"type": "kvm-cni-shape", "shape": "cilium", "gateway": "10.99.%d.1", "hostLink": "kvmcilhost%d"}`, k, k)
		},
		gw4: func(k int) string { return fmt.Sprintf("10.99.%d.1", k) }, gw6: none,
		nics:      1,
		hostLinks: func(k int) []string { return []string{fmt.Sprintf("kvmcilhost%d", k)} },
	},
	{
		name: "bridge-v6",
		plugins: func(k int, d string) string {
			return bridgePlugin(fmt.Sprintf("kvmv6b%d", k), d, fmt.Sprintf("fd92:%d::/64", k))
		},
		gw4:       none,
		gw6:       func(k int) string { return fmt.Sprintf("fd92:%d::1", k) },
		nics:      1,
		hostLinks: func(k int) []string { return []string{fmt.Sprintf("kvmv6b%d", k)} },
	},
	{
		name: "bridge-dual",
		plugins: func(k int, d string) string {
			return bridgePlugin(fmt.Sprintf("kvmdsb%d", k), d, fmt.Sprintf("10.92.%d.0/24", k), fmt.Sprintf("fd93:%d::/64", k))
		},
		gw4:       func(k int) string { return fmt.Sprintf("10.92.%d.1", k) },
		gw6:       func(k int) string { return fmt.Sprintf("fd93:%d::1", k) },
		nics:      1,
		hostLinks: func(k int) []string { return []string{fmt.Sprintf("kvmdsb%d", k)} },
	},
}

// shapeDNS is the pods' DNS configuration: the guest must end up with it.
var shapeDNS = &cri.DNSConfig{Servers: []string{"10.96.0.10", "fd96::a"}, Searches: []string{"kvm-it.svc.cluster.local"}}

// flavourIndex is c's index among the suite's containerds.
func (c *containerd) flavourIndex() int {
	for i, f := range c.suite.flavours {
		if f == c {
			return i
		}
	}
	return 0
}

// useCNI makes conflist (plugins, then loopback) CRI's pod network until
// t ends (see loadCNI).
func (c *containerd) useCNI(t *testing.T, cl *criClient, name, plugins string) {
	t.Helper()
	unload := c.loadCNI(t, cl, name, plugins)
	t.Cleanup(func() {
		if err := unload(); err != nil {
			t.Error(err)
		}
	})
}

// loadCNI makes conflist (plugins, then loopback) CRI's pod network and
// waits until CRI has loaded it; unload removes it and waits until CRI is
// back on the suite's own network. CRI loads the first network of its conf
// dir by name, and reloads when the dir changes.
func (c *containerd) loadCNI(t *testing.T, cl *criClient, name, plugins string) (unload func() error) {
	t.Helper()
	conf := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": %q, "plugins": [%s, {"type": "loopback"}]}`, name, plugins)
	var check any
	if err := json.Unmarshal([]byte(conf), &check); err != nil {
		t.Fatalf("CNI config of %s is not JSON: %v\n%s", name, err, conf)
	}
	path := filepath.Join(c.CNIConfDir, "00-"+name+".conflist")
	if err := os.WriteFile(path+".tmp", []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
	unload = func() error {
		os.Remove(path)
		if err := cl.waitCNILoaded(cniNetwork); err != nil {
			return fmt.Errorf("CRI did not go back to the suite's network: %w", err)
		}
		return nil
	}
	if err := cl.waitCNILoaded(name); err != nil {
		_ = unload()
		t.Fatal(err)
	}
	return unload
}

// waitCNILoaded waits until CRI's status names network as its pod network.
func (cl *criClient) waitCNILoaded(network string) error {
	return poll(30*time.Second, func() (bool, string) {
		ctx, cancel := criCtx()
		defer cancel()
		resp, err := cl.Runtime.Status(ctx, &cri.StatusRequest{Verbose: true})
		if err != nil {
			return false, err.Error()
		}
		var info struct {
			Networks []struct {
				Config struct{ Name string }
			}
		}
		_ = json.Unmarshal([]byte(resp.Info["cniconfig"]), &info)
		var names []string
		for _, n := range info.Networks {
			names = append(names, n.Config.Name)
			if n.Config.Name == network {
				return true, ""
			}
		}
		return false, fmt.Sprintf("CRI's CNI networks are %v, want %s", names, network)
	})
}

// podIPs are all of the pod's addresses as CRI reports them.
func (cl *criClient) podIPs(t *testing.T, p *pod) []string {
	t.Helper()
	ctx, cancel := criCtx()
	defer cancel()
	resp, err := cl.Runtime.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: p.id})
	if err != nil {
		t.Fatal(err)
	}
	ips := []string{resp.Status.GetNetwork().GetIp()}
	for _, a := range resp.Status.GetNetwork().GetAdditionalIps() {
		ips = append(ips, a.GetIp())
	}
	return ips
}

// hostTargets are addresses of this host outside every pod's prefix, for
// the guests to reach through their default routes, and an echo server
// on them; removed when t ends.
type hostTargets struct {
	v4, v6 string
	port   int
}

func (c *containerd) startHostTargets(t *testing.T) hostTargets {
	t.Helper()
	k := c.flavourIndex()
	ht := hostTargets{v4: fmt.Sprintf("10.98.%d.1", k), v6: canon(fmt.Sprintf("fd98:%d::1", k))}
	for _, a := range []string{ht.v4 + "/32", ht.v6 + "/128"} {
		if out, err := exec.Command("ip", "addr", "add", a, "dev", "lo").CombinedOutput(); err != nil {
			t.Fatalf("ip addr add %s dev lo: %v: %s", a, err, out)
		}
		t.Cleanup(func() { _ = exec.Command("ip", "addr", "del", a, "dev", "lo").Run() })
	}
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ht.port = l.Addr().(*net.TCPAddr).Port
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
				line, _ := bufio.NewReader(conn).ReadString('\n')
				fmt.Fprint(conn, line)
			}()
		}
	}()
	return ht
}

// ping pings addr from the host (busybox's ping: Debian's busybox-static
// is there for the guest images) until it answers or timeout passes.
func ping(addr string, timeout time.Duration) error {
	return poll(timeout, func() (bool, string) {
		out, err := exec.Command("busybox", "ping", "-c", "1", "-W", "2", addr).CombinedOutput()
		return err == nil, fmt.Sprintf("ping %s: %v: %s", addr, err, out)
	})
}

// probeTo asks the test guest at ip (its TCP port 8) to connect to
// target:port and returns its answer ("PROBE-OK probe" when it got there).
func probeTo(ip, target string, port int) (string, error) {
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(ip, "8"), 5*time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err = fmt.Fprintf(conn, "%s %d\n", target, port); err != nil {
		return "", err
	}
	got, err := bufio.NewReader(conn).ReadString('\n')
	return strings.TrimSpace(got), err
}

// TestCRINetworkShapes runs a direct-boot VM pod in each pod network shape
// of the main CNIs, on both containerd flavours: ptp, Calico (dual-stack,
// /32 and /128, link-local gateways, and a second interface net1), Cilium
// (/32, gateway on a host-side cilium_host-like link), IPv6-only and
// dual-stack bridges. The guest must have every pod address on the NIC
// with the pod interface's MAC, its default routes, and the pod's DNS; it
// answers ping and TCP on every pod address from the host, pings its
// gateways and reaches the host through its default routes. In the Calico
// pod, the network's bad inputs are refused first, leaving nothing. Nothing
// is left once the pods are gone. TestCRICloudInit boots the Debian cloud
// image in the same shapes, each on one flavour. The flavours run at once:
// each makes its shapes' networks, host links and host targets with its
// own index k.
func TestCRINetworkShapes(t *testing.T) {
	s := requireKVM(t, "kernel", "pause")
	if s.cniErr != nil {
		t.Fatal(s.cniErr)
	}
	s.forEachFlavourAtOnce(t, func(t *testing.T, c *containerd) {
		c.cleanupAfter(t)
		cl := c.cri(t)
		k := c.flavourIndex()
		ht := c.startHostTargets(t)
		var shims []shimID
		for _, shape := range cniShapes {
			t.Run(shape.name, func(t *testing.T) {
				if shape.hostLinks != nil {
					t.Cleanup(func() {
						for _, l := range shape.hostLinks(k) {
							_ = exec.Command("ip", "link", "del", l).Run()
						}
					})
				}
				network := "kvmshape-" + shape.name
				c.useCNI(t, cl, network, shape.plugins(k, filepath.Join(c.IPAMDir, network)))
				p := c.runPodWith(t, cl, "shape-"+shape.name, "kvm", nil, shapeDNS)
				pn := cl.podNetwork(t, p)
				ips := cl.podIPs(t, p)
				shims = append(shims, shimID{nsCRI, p.id})
				defer cl.stopAndRemovePod(t, p)
				if shape.badInput {
					c.checkNetworkBadInput(t, cl, p, pn.netns)
				}
				v := c.startShapeVM(t, cl, p, "vm", "kernel")
				shims = append(shims, shimID{nsCRI, v.cid})
				c.checkShapeGuest(t, shape, k, v, ips, ht)
				c.stopAndCheckNetwork(t, cl, &netVM{podContainer: v, net: pn, domain: c.domainOf(t, v.cid).Name})
			})
		}
		assertNothingLeft(t, c, shims...)
	})
}

// startShapeVM creates and starts a VM container of image in pod p.
func (c *containerd) startShapeVM(t *testing.T, cl *criClient, p *pod, name, image string) *podContainer {
	t.Helper()
	cfg := containerConfig(name, c.suite.images[image].ref, nil)
	if image == "cloud" {
		cfg.Linux.Resources.MemoryLimitInBytes = 1 << 30
	}
	return c.startContainerIn(t, cl, p, cfg)
}

func (c *containerd) startContainerIn(t *testing.T, cl *criClient, p *pod, cfg *cri.ContainerConfig) *podContainer {
	t.Helper()
	v := cl.startContainerIn(t, p, cfg)
	t.Cleanup(func() {
		if t.Failed() {
			b, err := os.ReadFile(v.logPath)
			t.Logf("CRI log %s (tail, %v):\n%s", v.logPath, err, testenv.Tail(string(b), 60))
		}
	})
	return v
}

// guestReport is what the test guest's /init printed of its network.
type guestReport struct {
	nics   map[string][]string // MAC -> addresses with prefix
	routes string
	dns    string
}

func readGuestReport(t *testing.T, logPath string) guestReport {
	t.Helper()
	if _, err := waitLogMessage(logPath, guestNetLine, bootTimeout); err != nil {
		t.Fatalf("the guest never configured its network: %v", err)
	}
	r := guestReport{nics: map[string][]string{}}
	for _, l := range logMessages(logPath, "KVM-GUEST-NETIF ") {
		f := strings.Fields(l)
		if len(f) >= 3 {
			r.nics[f[2]] = f[3:]
		}
	}
	if m := logMessages(logPath, "KVM-GUEST-ROUTES "); len(m) > 0 {
		r.routes = m[0]
	}
	if m := logMessages(logPath, "KVM-GUEST-DNS "); len(m) > 0 {
		r.dns = m[0]
	}
	return r
}

// checkShapeGuest checks a running test guest against the pod's network.
func (c *containerd) checkShapeGuest(t *testing.T, shape cniShape, k int, v *podContainer, ips []string, ht hostTargets) {
	t.Helper()
	netns := c.podNetnsOf(t, v.pod)
	r := readGuestReport(t, v.logPath)
	t.Logf("guest: NICs %v; %s; %s", r.nics, r.routes, r.dns)
	if len(r.nics) != shape.nics {
		t.Errorf("guest has %d NICs %v, want %d (one per pod interface)", len(r.nics), r.nics, shape.nics)
	}
	// Each pod interface's addresses are on the guest NIC with its MAC.
	for _, ifc := range podInterfaces(t, netns) {
		got := strings.Join(r.nics[ifc.mac], " ")
		for _, a := range ifc.addrs {
			if !strings.Contains(" "+got+" ", " "+a.Addr().String()+"/") {
				t.Errorf("guest NIC %s (pod %s) has %q, lacks %s", ifc.mac, ifc.name, got, a.Addr())
			}
		}
	}
	for _, gw := range []struct {
		addr, line string
		silent     bool
	}{{canon(shape.gw4(k)), "KVM-GUEST-GW-", shape.gw4Silent}, {canon(shape.gw6(k)), "KVM-GUEST-GW6-", false}} {
		if gw.addr == "" {
			continue
		}
		if !strings.Contains(r.routes, "default via "+gw.addr+" ") {
			t.Errorf("guest routes lack the default route via %s: %s", gw.addr, r.routes)
		}
		if got, err := waitLogMessage(v.logPath, gw.line, netTimeout); err != nil || (got != gw.line+"OK" && !gw.silent) {
			t.Errorf("guest's gateway %s: %q %v, want %sOK", gw.addr, got, err, gw.line)
		}
	}
	if want := "KVM-GUEST-DNS 10.96.0.10 fd96::a search kvm-it.svc.cluster.local"; r.dns != want {
		t.Errorf("guest DNS %q, want %q (the pod's)", r.dns, want)
	}
	for _, ip := range append(ips, net1Addrs(t, netns)...) {
		if err := ping(ip, netTimeout); err != nil {
			t.Errorf("the host pinging the guest: %v", err)
		}
		if err := waitEcho(net.JoinHostPort(ip, "7"), netTimeout); err != nil {
			t.Errorf("the host reaching the guest's echo service: %v", err)
		}
	}
	// Through its default routes the guest reaches addresses of the host
	// outside its prefixes.
	for _, ip := range ips {
		target := ht.v4
		if strings.Contains(ip, ":") {
			target = ht.v6
		}
		if got, err := probeTo(ip, target, ht.port); got != "PROBE-OK probe" {
			t.Errorf("guest (%s) reaching the host at %s through its default route: %q, %v", ip, target, got, err)
		}
	}
}

// podIf is one interface of the pod's netns as ip shows it.
type podIf struct {
	name, mac string
	addrs     []netip.Prefix
}

// podInterfaces lists the pod's CNI interfaces (not loopback, not our
// TAPs) with their MACs and global addresses.
func podInterfaces(t *testing.T, netns string) []podIf {
	t.Helper()
	out, err := inNetns(netns, "ip", "-j", "addr", "show")
	if err != nil {
		t.Fatal(err)
	}
	var links []struct {
		Name     string `json:"ifname"`
		MAC      string `json:"address"`
		LinkType string `json:"link_type"`
		Addrs    []struct {
			Local     string `json:"local"`
			PrefixLen int    `json:"prefixlen"`
			Scope     string `json:"scope"`
		} `json:"addr_info"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil {
		t.Fatalf("ip -j addr: %v\n%s", err, out)
	}
	var ifs []podIf
	for _, l := range links {
		if l.LinkType == "loopback" || strings.HasPrefix(l.Name, tapPrefix) {
			continue
		}
		i := podIf{name: l.Name, mac: l.MAC}
		for _, a := range l.Addrs {
			if p, err := netip.ParsePrefix(a.Local + "/" + strconv.Itoa(a.PrefixLen)); err == nil && a.Scope == "global" {
				i.addrs = append(i.addrs, p)
			}
		}
		ifs = append(ifs, i)
	}
	return ifs
}

// net1Addrs are the addresses of the pod's second interface, if any.
func net1Addrs(t *testing.T, netns string) []string {
	var out []string
	for _, i := range podInterfaces(t, netns) {
		if i.name == "net1" {
			for _, a := range i.addrs {
				out = append(out, a.Addr().String())
			}
		}
	}
	return out
}

// podNetnsOf is the network namespace of pod p.
func (c *containerd) podNetnsOf(t *testing.T, p *pod) string {
	t.Helper()
	cl := c.cri(t)
	return cl.podNetwork(t, p).netns
}

// checkNetworkBadInput tries VM containers the shim must refuse for their
// pod network, in pod p whose namespace is netns (a Calico-shaped pod):
// each is refused with a message naming the problem and leaves no TAP,
// qdisc or filter in the namespace.
func (c *containerd) checkNetworkBadInput(t *testing.T, cl *criClient, p *pod, netns string) {
	t.Helper()
	mustIn := func(args ...string) {
		t.Helper()
		if _, err := inNetns(netns, args...); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name        string
		annotations map[string]string
		setup       []string // ip command in the netns before the create
		undo        []string // and after it
		code        codes.Code
		want        []string
	}{
		{name: "no-config-drive", annotations: map[string]string{"kvm.containerd.io/config-drive": "false"},
			code: codes.InvalidArgument, want: []string{"kvm.containerd.io/config-drive=false", "ip=", "the pod has 2 interfaces"}},
		{name: "changed", setup: []string{"ip", "addr", "add", "10.97.0.9/32", "dev", "eth0"},
			undo: []string{"ip", "addr", "del", "10.97.0.9/32", "dev", "eth0"},
			code: codes.FailedPrecondition, want: []string{"changed since its sandbox", "10.97.0.9/32"}},
		{name: "no-address", setup: []string{"ip", "link", "add", "net2", "type", "veth", "peer", "name", "net3"},
			undo: []string{"ip", "link", "del", "net2"},
			code: codes.InvalidArgument, want: []string{"interface net2 has no IP address"}},
		{name: "too-many", setup: []string{"sh", "-c", "for i in 2 4 6 8; do ip link add net$i type veth peer name net$((i+1)); done"},
			undo: []string{"sh", "-c", "for i in 2 4 6 8; do ip link del net$i; done"},
			code: codes.InvalidArgument, want: []string{"has 10 interfaces", "at most 8"}},
	}
	for _, tc := range cases {
		t.Run("bad-"+tc.name, func(t *testing.T) {
			if tc.setup != nil {
				mustIn(tc.setup...)
			}
			// CRI creates the task, and so calls the shim, in StartContainer.
			cfg := containerConfig("bad-"+tc.name, c.suite.images["kernel"].ref, tc.annotations)
			cid, err := cl.createContainer(p, cfg)
			if err == nil {
				ctx, cancel := criCtx()
				_, err = cl.Runtime.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: cid})
				cancel()
				ctx, cancel = criCtx()
				if _, rerr := cl.Runtime.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: cid}); rerr != nil {
					t.Errorf("RemoveContainer %s: %v", cid, rerr)
				}
				cancel()
			}
			if tc.undo != nil {
				mustIn(tc.undo...)
			}
			if err == nil {
				t.Fatalf("CreateContainer and StartContainer succeeded, want %v with %q", tc.code, tc.want)
			}
			t.Logf("refused as wanted: %v", err)
			if st, _ := status.FromError(err); st.Code() != tc.code {
				t.Errorf("CreateContainer: code %v, want %v: %v", st.Code(), tc.code, err)
			}
			if m := missingWords(err.Error(), tc.want); len(m) > 0 {
				t.Errorf("CreateContainer: %v\nlacks %q", err, m)
			}
			if left := netnsLeftovers(netns); len(left) > 0 {
				t.Errorf("left in the pod's namespace after the refused create:\n  %s", strings.Join(left, "\n  "))
			}
			if socks, _ := filepath.Glob(netfdSocketDir + "/*.sock"); len(socks) > 0 {
				for _, sk := range socks {
					if strings.Contains(sk, "bad-"+tc.name) {
						t.Errorf("descriptor socket %s left", sk)
					}
				}
			}
		})
	}
}
