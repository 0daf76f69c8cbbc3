//go:build integration

package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// netTimeout bounds how long a booted guest may take to answer on the
// network (its services start right after KVM-GUEST-NET).
const netTimeout = time.Minute

// Console lines of the test guest's network setup (hack/guest/init).
const (
	guestNetLine      = "KVM-GUEST-NET "
	guestFeaturesLine = "KVM-GUEST-VIRTIO-NET-FEATURES "
	guestGWLine       = "KVM-GUEST-GW-"
	guestDriveLine    = "KVM-GUEST-CONFIGDRIVE "
)

// tapPrefix starts the name of the TAP the shim makes in a pod's netns.
const tapPrefix = "kvmtap"

// podNet is what CRI reports of a pod's network.
type podNet struct {
	ip    string // PodSandboxStatus network ip
	netns string // path of the pod's network namespace
}

// podNetwork reads the pod's IP and network namespace from PodSandboxStatus
// (sandboxNetwork) and fails t when CRI reports either as missing.
func (cl *criClient) podNetwork(t *testing.T, p *pod) podNet {
	t.Helper()
	ctx, cancel := criCtx()
	defer cancel()
	n, err := cl.sandboxNetwork(ctx, p.id)
	if err != nil {
		t.Fatalf("pod %s: %v", p.config.Metadata.Name, err)
	}
	return n
}

// sandboxNetwork reads the IP and network namespace of sandbox id from
// PodSandboxStatus (the netns path from the verbose info's runtime spec, as
// both 1.6 and 2.x report it); it is an error when either is missing.
func (cl *criClient) sandboxNetwork(ctx context.Context, id string) (podNet, error) {
	resp, err := cl.Runtime.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true})
	if err != nil {
		return podNet{}, fmt.Errorf("PodSandboxStatus %s: %w", id, err)
	}
	var info struct {
		RuntimeSpec struct {
			Linux struct {
				Namespaces []struct {
					Type string `json:"type"`
					Path string `json:"path"`
				} `json:"namespaces"`
			} `json:"linux"`
		} `json:"runtimeSpec"`
	}
	if err := json.Unmarshal([]byte(resp.Info["info"]), &info); err != nil {
		return podNet{}, fmt.Errorf("PodSandboxStatus %s: verbose info: %v\n%s", id, err, resp.Info["info"])
	}
	n := podNet{ip: resp.Status.GetNetwork().GetIp()}
	for _, ns := range info.RuntimeSpec.Linux.Namespaces {
		if ns.Type == "network" {
			n.netns = ns.Path
		}
	}
	if n.ip == "" || n.netns == "" {
		return n, fmt.Errorf("CRI reports IP %q and network namespace %q; want both", n.ip, n.netns)
	}
	return n, nil
}

// gateway is the CNI bridge's address (host-local's default gateway: the
// first address of the subnet), the pod's default route.
func (c *containerd) gateway() string {
	p := netip.MustParsePrefix(c.Subnet)
	return p.Masked().Addr().Next().String()
}

// inNetns runs a command in the network namespace at path with nsenter
// (the tests may use ip, tc and ethtool; the shim itself may not).
func inNetns(netns string, args ...string) (string, error) {
	out, err := exec.Command("nsenter", append([]string{"--net=" + netns, "--"}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("nsenter --net=%s %s: %v: %s", netns, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// ipLinkName matches a line of `ip -o link show`: "2: eth0@if7: <...".
var ipLinkName = regexp.MustCompile(`^\d+: ([^:@ ]+)(@[^:]*)?:`)

// netnsLinks lists the interfaces in a network namespace.
func netnsLinks(netns string) ([]string, error) {
	out, err := inNetns(netns, "ip", "-o", "link", "show")
	if err != nil {
		return nil, err
	}
	var names []string
	for _, line := range strings.Split(out, "\n") {
		if m := ipLinkName.FindStringSubmatch(line); m != nil {
			names = append(names, m[1])
		}
	}
	return names, nil
}

// netnsTAPs lists the TAPs the shim made (kvmtap*) in a namespace.
func netnsTAPs(netns string) ([]string, error) {
	links, err := netnsLinks(netns)
	var taps []string
	for _, l := range links {
		if strings.HasPrefix(l, tapPrefix) {
			taps = append(taps, l)
		}
	}
	return taps, err
}

// ingressFilters returns `tc filter show dev <link> ingress`, "" when
// the link has no ingress qdisc or no filter.
func ingressFilters(netns, link string) (string, error) {
	out, err := inNetns(netns, "tc", "filter", "show", "dev", link, "ingress")
	if err != nil && strings.Contains(out, "Cannot find specified qdisc") {
		return "", nil
	}
	return strings.TrimSpace(out), err
}

// netnsLeftovers lists what the shim's network wiring may leave in a pod
// namespace once its VM is deleted: TAPs, ingress qdiscs, ingress filters.
// CNI's bridge plugin adds none of them.
func netnsLeftovers(netns string) []string {
	links, err := netnsLinks(netns)
	if err != nil {
		return []string{err.Error()}
	}
	var found []string
	for _, l := range links {
		if strings.HasPrefix(l, tapPrefix) {
			found = append(found, "TAP "+l+" in "+netns)
		}
		out, err := inNetns(netns, "tc", "qdisc", "show", "dev", l)
		if err != nil {
			found = append(found, err.Error())
		} else if strings.Contains(out, "qdisc ingress") {
			found = append(found, fmt.Sprintf("ingress qdisc on %s in %s", l, netns))
		}
		if f, err := ingressFilters(netns, l); err != nil {
			found = append(found, err.Error())
		} else if f != "" {
			found = append(found, fmt.Sprintf("ingress filters on %s in %s: %s", l, netns, f))
		}
	}
	return found
}

// waitNetnsClean polls until netnsLeftovers finds nothing.
func waitNetnsClean(netns string) error {
	var last []string
	err := poll(leftoverTimeout, func() (bool, string) {
		last = netnsLeftovers(netns)
		return len(last) == 0, strings.Join(last, "; ")
	})
	if err != nil {
		return fmt.Errorf("network namespace %s after the VM was deleted:\n  %s", netns, strings.Join(last, "\n  "))
	}
	return nil
}

// logMessages returns the messages of the CRI log lines (or plain console
// lines) at path that contain marker, from the marker on.
func logMessages(path, marker string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var msgs []string
	for _, line := range strings.Split(string(b), "\n") {
		if i := strings.Index(line, marker); i >= 0 {
			msgs = append(msgs, strings.TrimSpace(strings.TrimRight(line[i:], "\r")))
		}
	}
	return msgs
}

// waitLogMessage waits for a line with marker in the CRI log at path and
// returns it from the marker on.
func waitLogMessage(path, marker string, timeout time.Duration) (string, error) {
	var msg string
	err := poll(timeout, func() (bool, string) {
		if m := logMessages(path, marker); len(m) > 0 {
			msg = m[0]
			return true, ""
		}
		b, _ := os.ReadFile(path)
		return false, fmt.Sprintf("%s has no %q; tail:\n%s", path, marker, testenv.Tail(string(b), 20))
	})
	return msg, err
}

// guestNet is the guest's KVM-GUEST-NET line: "<if> <addr>/<mask> gw <gw>".
type guestNet struct{ ifname, addr, mask, gw string }

var guestNetRE = regexp.MustCompile(`^KVM-GUEST-NET (\S+) ([0-9.]+)/([0-9.]+) gw ?(\S*)$`)

func parseGuestNet(line string) (guestNet, error) {
	m := guestNetRE.FindStringSubmatch(line)
	if m == nil {
		return guestNet{}, fmt.Errorf("unexpected network line %q", line)
	}
	return guestNet{m[1], m[2], m[3], m[4]}, nil
}

// checkGuestNetwork waits for the guest's network lines in the console log
// of v and checks them against the pod's IP and gateway: address, a /24
// netmask (the suite's subnets), the gateway, and the gateway's answer.
func (c *containerd) checkGuestNetwork(t *testing.T, v *netVM) {
	t.Helper()
	line, err := waitLogMessage(v.logPath, guestNetLine, bootTimeout)
	if err != nil {
		t.Fatalf("the guest never configured its network: %v", err)
	}
	g, err := parseGuestNet(line)
	if err != nil {
		t.Fatal(err)
	}
	if g.addr != v.net.ip || g.mask != "255.255.255.0" || g.gw != c.gateway() {
		how := "network_data.json of its config drive"
		if d, dumpDomainErr := dumpDomain(v.domain); dumpDomainErr == nil && d.OS.Cmdline != "" {
			how = fmt.Sprintf("kernel command line %q", d.OS.Cmdline)
		}
		t.Errorf("pod %s: guest network %q, want address %s/255.255.255.0 gw %s (the pod's, from CRI); the guest had its %s",
			v.config.Metadata.Name, line, v.net.ip, c.gateway(), how)
	}
	if g.gw == "" {
		return // the guest pings no gateway it was not given; reported above
	}
	gw, err := waitLogMessage(v.logPath, guestGWLine, netTimeout)
	if err != nil {
		t.Errorf("the guest did not report whether its gateway answers: %v", err)
	} else if gw != "KVM-GUEST-GW-OK" {
		t.Errorf("guest reports %q: the pod's gateway %s did not answer its ping", gw, c.gateway())
	}
}

// echo connects to addr, sends a line and expects it back.
func echo(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	want := fmt.Sprintf("echo-%d", time.Now().UnixNano())
	if _, err = fmt.Fprintln(conn, want); err != nil {
		return err
	}
	got, err := bufio.NewReader(conn).ReadString('\n')
	if strings.TrimSpace(got) != want {
		return fmt.Errorf("sent %q to %s, got back %q (%v)", want, addr, got, err)
	}
	return nil
}

// waitEcho polls addr's echo service until it answers.
func waitEcho(addr string, timeout time.Duration) error {
	return poll(timeout, func() (bool, string) {
		err := echo(addr)
		return err == nil, fmt.Sprintf("echo on %s: %v", addr, err)
	})
}

// probe asks the guest at ip (its TCP port 8) to connect to target's echo
// port and returns the guest's answer: "PROBE-OK probe" when it got there.
func probe(ip, target string) (string, error) {
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(ip, "8"), 5*time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err = fmt.Fprintf(conn, "%s 7\n", target); err != nil {
		return "", err
	}
	got, err := bufio.NewReader(conn).ReadString('\n')
	return strings.TrimSpace(got), err
}

// virtio-net feature bits (virtio spec 5.1.3) that carry TSO and checksum
// offload between host and guest.
var offloadFeatures = map[int]string{0: "CSUM", 1: "GUEST_CSUM", 7: "GUEST_TSO4", 11: "HOST_TSO4"}

// checkOffloads checks that the TAP offers TSO and checksum offload
// (ethtool -k) and that the guest's virtio-net driver negotiated them (its
// KVM-GUEST-VIRTIO-NET-FEATURES line: character i is feature bit i).
func checkOffloads(t *testing.T, netns, tap, logPath string) {
	t.Helper()
	out, err := inNetns(netns, "ethtool", "-k", tap)
	if err != nil {
		t.Errorf("ethtool: %v", err)
	}
	for _, want := range []string{"tcp-segmentation-offload: on", "tx-checksumming: on"} {
		if !strings.Contains(out, want) {
			t.Errorf("ethtool -k %s lacks %q:\n%s", tap, want, out)
		}
	}
	line, err := waitLogMessage(logPath, guestFeaturesLine, netTimeout)
	if err != nil {
		t.Errorf("the guest did not report its virtio-net features: %v", err)
		return
	}
	bits := strings.TrimSpace(strings.TrimPrefix(line, guestFeaturesLine))
	for bit, name := range offloadFeatures {
		if bit >= len(bits) || bits[bit] != '1' {
			t.Errorf("virtio-net feature %d (%s) not negotiated by the guest: features %q", bit, name, bits)
		}
	}
}

// checkWiring checks the tc redirects between the CNI interface and the TAP.
func checkWiring(t *testing.T, netns, podIf, tap string) {
	t.Helper()
	for _, dir := range [][2]string{{podIf, tap}, {tap, podIf}} {
		f, err := ingressFilters(netns, dir[0])
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		if want := "mirred (Egress Redirect to device " + dir[1] + ")"; !strings.Contains(f, "u32") || !strings.Contains(f, want) {
			t.Errorf("ingress filters of %s lack a u32 filter with %q:\n%s", dir[0], want, f)
		}
	}
}

// netVM is a VM pod with its network as CRI and libvirt report it.
type netVM struct {
	*podContainer
	net    podNet
	domain string
	tap    string
}

// startNetVM starts a VM pod of image and finds its domain, network and TAP.
func (c *containerd) startNetVM(t *testing.T, cl *criClient, name, image string, podAnnotations map[string]string) *netVM {
	t.Helper()
	v := &netVM{podContainer: c.startPodContainerWith(t, cl, name, "kvm", c.suite.images[image].ref, podAnnotations)}
	v.net = cl.podNetwork(t, v.pod)
	v.domain = c.domainOf(t, v.cid).Name
	taps, err := netnsTAPs(v.net.netns)
	if err != nil || len(taps) != 1 {
		t.Fatalf("pod %s: TAPs in %s: %v (%v), want exactly one %s*", name, v.net.netns, taps, err, tapPrefix)
	}
	v.tap = taps[0]
	return v
}

func (v *netVM) addr(port int) string { return net.JoinHostPort(v.net.ip, strconv.Itoa(port)) }

// stopAndCheckNetwork stops the VM container (ACPI, exit 0) and checks
// that its network pieces are gone while the pod (and its netns) remain:
// TAP, qdiscs and filters, the descriptor socket, the wrapper and QEMU.
func (c *containerd) stopAndCheckNetwork(t *testing.T, cl *criClient, v *netVM) {
	t.Helper()
	if err := cl.stopContainer(v.podContainer); err != nil {
		t.Error(err)
	}
	if err := waitNetnsClean(v.net.netns); err != nil {
		t.Error(err)
	}
	checkVMGone(t, v)
}

// checkVMGone checks that the VM's descriptor socket and its processes
// (the wrapper, QEMU) are gone.
func checkVMGone(t *testing.T, v *netVM) {
	t.Helper()
	sock := netfdSocketDir + "/" + v.domain + ".sock"
	if err := poll(leftoverTimeout, func() (bool, string) {
		_, err := os.Lstat(sock)
		return errors.Is(err, os.ErrNotExist), fmt.Sprintf("%s still there (%v)", sock, err)
	}); err != nil {
		t.Errorf("network descriptor socket after the VM stopped: %v", err)
	}
	if err := waitDomainProcessesGone(v.domain, leftoverTimeout); err != nil {
		t.Errorf("after the VM stopped: %v", err)
	}
}

// TestCRINetwork runs two VM pods on the CNI bridge: each guest has its pod
// IP and gateway, the host reaches its echo service, the TAP keeps TSO and
// checksum offload and the guest negotiates them, and the two VMs reach
// each other. A stranger gets no descriptors from the netfd socket. Once a
// VM stops, nothing of its wiring is left in its pod's namespace; once a
// pod is stopped and removed with its VM still running, nothing is left.
func TestCRINetwork(t *testing.T) {
	s := requireKVM(t, "kernel", "pause")
	s.forEachFlavour(t, func(t *testing.T, c *containerd) {
		c.cleanupAfter(t)
		cl := c.cri(t)
		a := c.startNetVM(t, cl, "net-a", "kernel", nil)
		b := c.startNetVM(t, cl, "net-b", "kernel", nil)
		for _, v := range []*netVM{a, b} {
			c.checkGuestNetwork(t, v)
			if err := waitEcho(v.addr(7), netTimeout); err != nil {
				t.Fatalf("pod %s from the host: %v", v.config.Metadata.Name, err)
			}
			checkOffloads(t, v.net.netns, v.tap, v.logPath)
			checkWiring(t, v.net.netns, "eth0", v.tap)
		}
		// The namespace check must see the wiring, or it proves nothing.
		left := strings.Join(netnsLeftovers(a.net.netns), "\n")
		for _, want := range []string{"TAP " + a.tap, "ingress qdisc on eth0", "ingress qdisc on " + a.tap,
			"ingress filters on eth0", "ingress filters on " + a.tap} {
			if !strings.Contains(left, want) {
				t.Errorf("netns leftovers while the VM runs lack %q; got:\n%s", want, left)
			}
		}

		// The leftover check must see a networked VM, or it proves nothing.
		left = strings.Join(c.leftovers(nil), "\n")
		for _, want := range []string{
			"VM process ", "network descriptor socket " + netfdSocketDir + "/" + a.domain + ".sock",
			"NUMA reservation of " + a.domain + "/",
		} {
			if !strings.Contains(left, want) {
				t.Errorf("leftovers while VMs run lack %q; got:\n%s", want, left)
			}
		}

		for _, p := range [][2]*netVM{{a, b}, {b, a}} {
			got, err := probe(p[0].net.ip, p[1].net.ip)
			if got != "PROBE-OK probe" {
				t.Errorf("pod %s probing %s:7: got %q (%v), want \"PROBE-OK probe\"",
					p[0].config.Metadata.Name, p[1].net.ip, got, err)
			}
		}

		t.Run("netfd-refuses-strangers", func(t *testing.T) {
			c.checkNetfdRefuses(t, a)
		})

		// a stops as kubelet stops a container, with its pod and netns
		// still there; b goes with its pod: StopPodSandbox stops the VM,
		// CNI DEL and the netns follow, then RemovePodSandbox.
		c.stopAndCheckNetwork(t, cl, a)
		cl.removePod(t, a.podContainer)
		cl.stopAndRemovePod(t, b.pod)
		checkVMGone(t, b)
		assertNothingLeft(t, c, append(a.shimIDs(), b.shimIDs()...)...)
	})
}

// checkNetfdRefuses connects to a running VM's descriptor socket as root
// (this test process) and runs the emulator wrapper as the QEMU user with a
// command line naming the VM, as a stranger pretending to be its QEMU: both
// must get no descriptor, and the VM must keep its network.
func (c *containerd) checkNetfdRefuses(t *testing.T, v *netVM) {
	sock := netfdSocketDir + "/" + v.domain + ".sock"
	mark := c.LogSize()

	n, fds, err := readNetfd(sock)
	for _, fd := range fds {
		unix.Close(fd)
	}
	if len(fds) > 0 || n > 0 {
		t.Errorf("root (not the QEMU user) connecting to %s got %d bytes and %d descriptors, want none", sock, n, len(fds))
	}
	if !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("root connecting to %s: %v, want the server to close the connection (EOF)", sock, err)
	}

	// The VM's own uid (its domain's DAC label) reaches the socket; the
	// shared QEMU user of other VMs does not even get to connect.
	vmUID := domainUID(t, v.domain)
	u, err := user.Lookup("libvirt-qemu")
	if err != nil {
		t.Fatalf("the QEMU user: %v", err)
	}
	sharedUID, _ := strconv.Atoi(u.Uid)
	for _, who := range []struct {
		name string
		uid  uint32
		want string
	}{{"the VM's uid", vmUID, "network of " + v.domain}, {"libvirt-qemu", uint32(sharedUID), "permission denied"}} {
		// If the wrapper got the descriptors it would exec QEMU with
		// -version, which prints its version and exits 0: no stray VM
		// either way.
		cmd := exec.Command(c.suite.wrapper, "-name", "guest="+v.domain+",debug-threads=on", "-version")
		cmd.Dir = "/"
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: who.uid, Gid: who.uid, Groups: []uint32{}}}
		out, err := runWithTimeout(cmd, 30*time.Second)
		if err == nil || !strings.Contains(out, "network of "+v.domain) || !strings.Contains(out, who.want) {
			t.Errorf("the wrapper run as %s (%d) by a stranger (not libvirt's process for %s): %v, output:\n%s\nwant it refused (exit "+
				"1, \"network of %s: ...\" with %q)",
				who.name, who.uid, v.domain, err, out, v.domain, who.want)
		}
	}

	// The shim says why it refused, in containerd's log.
	for _, want := range []string{"runs as uid 0, not the QEMU user", "is not the process libvirt started for " + v.domain} {
		var line string
		if err := poll(10*time.Second, func() (bool, string) {
			for _, l := range strings.Split(c.LogTail(mark, 1<<20), "\n") {
				if strings.Contains(l, "refused network descriptors") && strings.Contains(l, want) {
					line = l
					return true, ""
				}
			}
			return false, ""
		}); err != nil {
			t.Errorf("containerd's log has no refusal %q from the shim", want)
		} else {
			t.Logf("shim: %s", line)
		}
	}

	if _, err := os.Lstat(sock); err != nil {
		t.Errorf("the socket is gone after refusing strangers: %v", err)
	}
	if err := waitEcho(v.addr(7), netTimeout); err != nil {
		t.Errorf("the VM lost its network after strangers knocked: %v", err)
	}
}

// readNetfd connects to a descriptor socket and reads one message, as the
// wrapper would; it returns the payload size and any descriptors received.
func readNetfd(sock string) (int, []int, error) {
	conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return 0, nil, err
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4*64))
	n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
	var fds []int
	if oobn > 0 {
		msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
		if perr != nil {
			return n, nil, errors.Join(err, perr)
		}
		for _, m := range msgs {
			if got, perr := unix.ParseUnixRights(&m); perr == nil {
				fds = append(fds, got...)
			}
		}
	}
	return n, fds, err
}

// runWithTimeout runs cmd, kills it after timeout, and returns its
// combined output.
func runWithTimeout(cmd *exec.Cmd, timeout time.Duration) (string, error) {
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return "", err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return out.String(), err
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done //nolint:errcheck // the exit status of a process killed here
		return out.String(), fmt.Errorf("%s still running after %v; killed", cmd.Path, timeout)
	}
}
