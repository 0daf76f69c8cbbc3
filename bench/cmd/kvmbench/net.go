package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// The host side of the network benchmark: fixed names on this host only.
const (
	netNS       = "kvmbench-net"
	netVethHost = "kvmbench-veth"
	netBridge   = "kvmbench-br"
	podAddr     = "10.89.30.2"
	podGateway  = "10.89.30.1"
	// calicoGateway is Calico's link-local gateway: no host holds it, so
	// the guest's ping of it goes unanswered, as in a Calico pod.
	calicoGateway = "169.254.1.1"
	bridgeAddr    = "10.89.31.2"
	bridgeGW      = "10.89.31.1"
	iperfImage    = "localhost/kvm-guest/iperf:latest"
)

// netVariant is one way the same guest reaches the host.
type netVariant struct {
	Key   string `json:"key"`
	Label string `json:"label"`
	// RxMbps: host to guest (iperf3 client on the host sends);
	// TxMbps: guest to host (iperf3 -R).
	RxMbps   []float64 `json:"rx_mbps"`
	TxMbps   []float64 `json:"tx_mbps"`
	Features []string  `json:"virtio_net_features"` // as the guest reported them
	Failures []string  `json:"failures,omitempty"`
}

// netResults is the bench-net section.
type netResults struct {
	Runs     int           `json:"runs"`
	Seconds  int           `json:"iperf_seconds"`
	Template string        `json:"bridge_domain_xml"`
	Variants []*netVariant `json:"variants"`
}

// runNet measures TCP throughput between the guest and a peer on the host
// side of the pod's network, in three ways on the same guest and image:
// (a) the shim's TAP with IFF_VNET_HDR and offloads, (b) the same with
// vnet_hdr = false, (c) the shim's own domain XML plus a libvirt-managed
// TAP on a host bridge, defined with go-libvirt. Containerd flavour: the
// first one.
func runNet(ctx context.Context, e *env) (_ *netResults, retErr error) {
	d := e.daemons[0]
	res := &netResults{Runs: e.cfg.netRuns, Seconds: e.cfg.netSeconds}
	if _, err := exec.LookPath("iperf3"); err != nil {
		return nil, fmt.Errorf("iperf3 is not installed on the host (apt-get install iperf3): %w", err)
	}
	archive, err := buildIperfImage(ctx, e)
	if err != nil {
		return nil, fmt.Errorf("build the iperf3 guest image: %w", err)
	}
	ref, err := d.Import(ctx, archive, testenv.NamespaceDefault)
	if err != nil {
		return nil, err
	}
	offCfg := filepath.Join(d.Dir, "kvm-shim-novnethdr.toml")
	b, err := os.ReadFile(d.ShimConfigPath)
	if err != nil {
		return nil, err
	}
	if err = os.WriteFile(offCfg, append(b, []byte("vnet_hdr = false\n")...), 0o644); err != nil {
		return nil, err
	}
	l, err := testenv.ConnectLibvirt()
	if err != nil {
		return nil, err
	}
	defer l.Disconnect()
	defer func() { retErr = errors.Join(retErr, netTeardown()) }()
	if err := netTeardown(); err != nil { // a previous run's leftovers
		return nil, err
	}
	if err := bridgeSetup(); err != nil {
		return nil, err
	}

	a := &netVariant{Key: "a", Label: "(a) shim TAP, IFF_VNET_HDR + offloads (vnet_hdr = true)"}
	bv := &netVariant{Key: "b", Label: "(b) shim TAP without IFF_VNET_HDR (vnet_hdr = false)"}
	c := &netVariant{Key: "c", Label: "(c) libvirt TAP on a host bridge (same domain XML + <interface type='bridge'>)"}
	cal := &netVariant{Key: "d", Label: "(d) shim TAP, IFF_VNET_HDR, Calico-shaped pod (/32, on-link 169.254.1.1, proxy ARP on the host veth)"}
	res.Variants = []*netVariant{a, bv, c, cal}
	nb := &netBench{d: d, e: e, ref: ref, l: l}
	var tmpl *domainTemplate
	for i := 0; i < e.cfg.netRuns; i++ {
		logf("net: iteration %d/%d", i+1, e.cfg.netRuns)
		for _, v := range res.Variants {
			var err error
			run := netRun{i: i, v: v}
			switch v.Key {
			case "a":
				var x *domainTemplate
				x, err = nb.shimRun(ctx, run, shimNetShape{cfg: d.ShimConfigPath, setup: podNetSetup, capture: tmpl == nil})
				if x != nil {
					tmpl = x
					res.Template = x.xml
				}
			case "b":
				_, err = nb.shimRun(ctx, run, shimNetShape{cfg: offCfg, setup: podNetSetup})
			case "d":
				_, err = nb.shimRun(ctx, run, shimNetShape{cfg: d.ShimConfigPath, setup: calicoNetSetup})
			case "c":
				if tmpl == nil {
					err = errors.New("no domain XML captured from (a)")
					break
				}
				err = nb.bridgeRun(ctx, tmpl, run)
			}
			if err != nil {
				logf("net: %s run %d failed: %v", v.Key, i, err)
				v.Failures = append(v.Failures, fmt.Sprintf("run %d: %v", i, err))
				d.ForceCleanup(ctx)
			}
		}
	}
	return res, nil
}

// buildIperfImage makes localhost/kvm-guest/iperf:latest: the test guest's
// kernel and initrd (hack/guest/build.sh) with a second initramfs archive
// appended that adds the host's iperf3 and the shared libraries ldd names.
func buildIperfImage(ctx context.Context, e *env) (string, error) {
	kernel := strings.TrimSpace(readFile("_output/guest-build/kernel.ref"))
	base, err := os.ReadFile("_output/guest-build/initrd.img")
	if err != nil || kernel == "" {
		return "", fmt.Errorf("the guest build (hack/guest/build.sh) left no initrd.img or kernel.ref in _output/guest-build: %v", err)
	}
	bin, err := exec.LookPath("iperf3")
	if err != nil {
		return "", err
	}
	entries := []cpioEntry{{name: "/usr/bin/iperf3", mode: 0o755, source: bin}}
	libs, err := sharedLibraries(ctx, bin)
	if err != nil {
		return "", err
	}
	for _, lib := range libs {
		resolved, err := filepath.EvalSymlinks(lib)
		if err != nil {
			return "", err
		}
		entries = append(entries, cpioEntry{name: lib, mode: 0o755, source: resolved})
	}
	var buf bytes.Buffer
	buf.Write(base)
	buf.Write(make([]byte, pad4(len(base))))
	if err := writeInitramfs(&buf, entries); err != nil {
		return "", err
	}
	dir := filepath.Join(e.work, "iperf-image")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	initrd := filepath.Join(dir, "initrd.img")
	if err := os.WriteFile(initrd, buf.Bytes(), 0o644); err != nil {
		return "", err
	}
	out := filepath.Join(dir, "iperf.tar")
	cmd := exec.CommandContext(ctx, "go", "run", "./hack/ocipack", "-name", iperfImage, "-out", out,
		"-file", "/boot/vmlinuz="+kernel+":0644", "-file", "/boot/initrd.img="+initrd+":0644", "-cmd", "/vm")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go run ./hack/ocipack: %v: %s", err, b)
	}
	return out, nil
}

var lddRE = regexp.MustCompile(`(?m)^\s*(?:\S+ => )?(/\S+) \(0x[0-9a-f]+\)$`)

// sharedLibraries lists the libraries (and the loader) ldd resolves for bin.
func sharedLibraries(ctx context.Context, bin string) ([]string, error) {
	out, err := exec.CommandContext(ctx, "ldd", bin).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", bin, err)
	}
	var libs []string
	for _, m := range lddRE.FindAllStringSubmatch(string(out), -1) {
		libs = append(libs, m[1])
	}
	if len(libs) == 0 {
		return nil, fmt.Errorf("ldd %s named no libraries: %s", bin, out)
	}
	return libs, nil
}

// sh runs a host command and returns its error with its output.
func sh(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// podNetSetup makes the pod's network as CNI would: a netns whose only
// interface is eth0, one end of a veth whose other end is on the host.
func podNetSetup(ctx context.Context) error {
	for _, args := range [][]string{
		{"netns", "add", netNS},
		{"link", "add", netVethHost, "type", "veth", "peer", "name", "eth0", "netns", netNS},
		{"addr", "add", podGateway + "/24", "dev", netVethHost},
		{"link", "set", netVethHost, "up"},
		{"-n", netNS, "addr", "add", podAddr + "/24", "dev", "eth0"},
		{"-n", netNS, "link", "set", "lo", "up"},
		{"-n", netNS, "link", "set", "eth0", "up"},
		{"-n", netNS, "route", "add", "default", "via", podGateway},
	} {
		if err := sh(ctx, "ip", args...); err != nil {
			return err
		}
	}
	return nil
}

// calicoNetSetup makes the pod's network as Calico does: the pod's eth0
// has a /32, an on-link route to 169.254.1.1 (which nobody holds) and the
// default route via it; the host end answers ARP for it by proxy and
// routes the pod's /32 to the veth.
func calicoNetSetup(ctx context.Context) error {
	for _, args := range [][]string{
		{"netns", "add", netNS},
		{"link", "add", netVethHost, "type", "veth", "peer", "name", "eth0", "netns", netNS},
		{"link", "set", netVethHost, "up"},
		{"route", "add", podAddr + "/32", "dev", netVethHost},
		{"-n", netNS, "addr", "add", podAddr + "/32", "dev", "eth0"},
		{"-n", netNS, "link", "set", "lo", "up"},
		{"-n", netNS, "link", "set", "eth0", "up"},
		{"-n", netNS, "route", "add", calicoGateway, "dev", "eth0", "scope", "link"},
		{"-n", netNS, "route", "add", "default", "via", calicoGateway, "dev", "eth0"},
	} {
		if err := sh(ctx, "ip", args...); err != nil {
			return err
		}
	}
	for _, key := range []string{"net/ipv4/conf/" + netVethHost + "/proxy_arp", "net/ipv4/neigh/" + netVethHost + "/proxy_delay"} {
		v := "1"
		if strings.HasSuffix(key, "proxy_delay") {
			v = "0"
		}
		if err := os.WriteFile("/proc/sys/"+key, []byte(v), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func podNetTeardown() error {
	var errs []error
	if _, err := os.Stat("/run/netns/" + netNS); err == nil {
		errs = append(errs, sh(context.Background(), "ip", "netns", "del", netNS))
	}
	// Deleting the netns destroys eth0 and so its peer, asynchronously.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	gone := func() (bool, string) {
		_, err := os.Stat("/sys/class/net/" + netVethHost)
		return errors.Is(err, os.ErrNotExist), netVethHost + " still exists"
	}
	if testenv.Poll(ctx, 50*time.Millisecond, gone) != nil {
		if err := sh(context.Background(), "ip", "link", "del", netVethHost); err != nil && !strings.Contains(err.Error(), "Cannot find device") {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func bridgeSetup() error {
	for _, args := range [][]string{
		{"link", "add", netBridge, "type", "bridge"},
		{"addr", "add", bridgeGW + "/24", "dev", netBridge},
		{"link", "set", netBridge, "up"},
	} {
		if err := sh(context.Background(), "ip", args...); err != nil {
			return err
		}
	}
	return nil
}

func netTeardown() error {
	err := podNetTeardown()
	if _, serr := os.Stat("/sys/class/net/" + netBridge); serr == nil {
		err = errors.Join(err, sh(context.Background(), "ip", "link", "del", netBridge))
	}
	return err
}

// consoleBuf collects a guest's console output.
type consoleBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (c *consoleBuf) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.b.Write(p)
}

func (c *consoleBuf) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.b.String()
}

// waitFor waits until the console shows want and returns the output.
func (c *consoleBuf) waitFor(ctx context.Context, want string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := testenv.Poll(ctx, 50*time.Millisecond, func() (bool, string) {
		return strings.Contains(c.String(), want), "console has no " + want + "; tail:\n" + testenv.Tail(c.String(), 15)
	})
	return c.String(), err
}

var featuresRE = regexp.MustCompile(`KVM-GUEST-VIRTIO-NET-FEATURES (\S+)`)

// guestLink is how the host reaches a booted iperf guest: its console's
// output, its console shell's input, and its address.
type guestLink struct {
	con   *consoleBuf
	shell io.Writer
	addr  string
}

// measureGuest waits for the guest's network, starts iperf3 -s in it
// through its console shell, and runs the host's client both ways for
// secs seconds each.
func measureGuest(ctx context.Context, g guestLink, secs int, v *netVariant) error {
	out, err := g.con.waitFor(ctx, "KVM-GUEST-GW-", 3*bootTimeout)
	if err != nil {
		return err
	}
	if !strings.Contains(out, "KVM-GUEST-GW-OK") && !strings.Contains(out, "gw "+calicoGateway) {
		return fmt.Errorf("the guest could not reach its gateway:\n%s", testenv.Tail(out, 15))
	}
	features := ""
	if m := featuresRE.FindStringSubmatch(out); m != nil {
		features = m[1]
	}
	if _, err = io.WriteString(g.shell, "\niperf3 -s -D\n"); err != nil {
		return fmt.Errorf("write to the guest's console: %w", err)
	}
	rx, err := iperf(ctx, g.addr, secs, false)
	if err != nil {
		return err
	}
	tx, err := iperf(ctx, g.addr, secs, true)
	if err != nil {
		return err
	}
	v.RxMbps = append(v.RxMbps, rx)
	v.TxMbps = append(v.TxMbps, tx)
	v.Features = append(v.Features, features)
	return nil
}

// iperf runs the host's iperf3 client against addr for secs seconds (the
// first second omitted) and returns the receiver's Mbit/s; it retries
// while the guest's server is not listening yet.
func iperf(ctx context.Context, addr string, secs int, reverse bool) (float64, error) {
	args := []string{"-c", addr, "-t", fmt.Sprint(secs), "-O", "1", "-J"}
	if reverse {
		args = append(args, "-R")
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := exec.CommandContext(ctx, "iperf3", args...).Output()
		var r struct {
			Error string `json:"error"`
			End   struct {
				SumReceived struct {
					BitsPerSecond float64 `json:"bits_per_second"`
				} `json:"sum_received"`
			} `json:"end"`
		}
		if jerr := json.Unmarshal(out, &r); jerr == nil && r.Error == "" && err == nil {
			return r.End.SumReceived.BitsPerSecond / 1e6, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("iperf3 %s: %v %s", strings.Join(args, " "), err, r.Error)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// netBench is what every run of the network benchmark uses: the daemon
// and the environment, the iperf image's ref, and a libvirt connection.
type netBench struct {
	d   *daemon
	e   *env
	ref string
	l   *libvirt.Libvirt
}

// netRun is one run: its iteration and the variant it measures.
type netRun struct {
	i int
	v *netVariant
}

// shimNetShape is how a shim variant runs: the shim's config, the setup
// of its pod-like netns, and whether to capture the bridge variant's
// template from the shim's domain XML.
type shimNetShape struct {
	cfg     string
	setup   func(context.Context) error
	capture bool
}

// shimRun boots the iperf guest with ctr in a pod-like netns (made by
// shape.setup) through the shim with shape.cfg, measures, and removes
// it. With shape.capture, it returns the bridge variant's template made
// from the shim's domain XML.
func (nb *netBench) shimRun(ctx context.Context, run netRun, shape shimNetShape) (tmpl *domainTemplate, retErr error) {
	d, e, v := nb.d, nb.e, run.v
	if err := shape.setup(ctx); err != nil {
		return nil, err
	}
	defer func() { retErr = errors.Join(retErr, podNetTeardown()) }()
	id := fmt.Sprintf("net-%s-%d", v.Key, run.i)
	cmd := d.CtrCmd(ctx, testenv.NamespaceDefault, "run", "--rm", "--runtime", testenv.RuntimeKVM,
		"--runtime-config-path", shape.cfg, "--with-ns", "network:/run/netns/"+netNS, nb.ref, id)
	con := &consoleBuf{}
	cmd.Stdout, cmd.Stderr = con, con
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if startErr := cmd.Start(); startErr != nil {
		return nil, startErr
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		d.Ctr(ctx, testenv.NamespaceDefault, "task", "kill", "-s", "KILL", id)
		select {
		case <-exited: //nolint:errcheck // the exit status of a container killed here
		case <-time.After(goneTimeout):
			_ = cmd.Process.Kill()
			<-exited //nolint:errcheck // the exit status of a process killed here
			retErr = errors.Join(retErr, fmt.Errorf("ctr run %s did not exit after SIGKILL", id))
		}
		stdin.Close()
		retErr = errors.Join(retErr, waitGone(ctx, d))
	}()
	if shape.capture {
		if _, err = con.waitFor(ctx, readyLine, 3*bootTimeout); err != nil {
			return nil, err
		}
		if tmpl, err = bridgeTemplate(nb.l, d, e); err != nil {
			return nil, fmt.Errorf("capture the shim's domain XML: %w", err)
		}
	}
	return tmpl, measureGuest(ctx, guestLink{con: con, shell: stdin, addr: podAddr}, e.cfg.netSeconds, v)
}

// bridgeTemplate takes the running shim VM's XML, copies its files, and
// makes it the bridge variant: a new identity, the bridge's address on the
// kernel command line, and a libvirt <interface type='bridge'>.
func bridgeTemplate(l *libvirt.Libvirt, d *daemon, e *env) (*domainTemplate, error) {
	x, err := onlyShimDomainXML(l, d)
	if err != nil {
		return nil, err
	}
	dom, vmDir, err := shimDomain(x)
	if err != nil {
		return nil, err
	}
	files := filepath.Join(e.rawDir, "net-files")
	if err = copyVMFiles(vmDir, files); err != nil {
		return nil, err
	}
	ip := fmt.Sprintf("ip=%s::%s:255.255.255.0:kvm-guest::off", bridgeAddr, bridgeGW)
	if dom.OS == nil || !ipArgRE.MatchString(dom.OS.Cmdline) {
		return nil, fmt.Errorf("the shim's kernel command line has no ip= argument:\n%s", x)
	}
	dom.OS.Cmdline = ipArgRE.ReplaceAllString(dom.OS.Cmdline, ip)
	dom.Devices.Interfaces = append(dom.Devices.Interfaces, libvirtxml.DomainInterface{
		Source: &libvirtxml.DomainInterfaceSource{Bridge: &libvirtxml.DomainInterfaceSourceBridge{Bridge: netBridge}},
		Model:  &libvirtxml.DomainInterfaceModel{Type: "virtio"},
	})
	return baselineTemplate(dom, vmDir, files, d.ShimStateDir)
}

var ipArgRE = regexp.MustCompile(`ip=\S+`)

// bridgeRun defines and starts the bridge variant from tmpl, drives its
// console socket directly, measures, and destroys it.
func (nb *netBench) bridgeRun(ctx context.Context, tmpl *domainTemplate, run netRun) (retErr error) {
	l, e := nb.l, nb.e
	name := fmt.Sprintf("kvmbench-net-%d-%d", os.Getpid(), run.i)
	runDir := filepath.Join(e.rawDir, fmt.Sprintf("net-run-%d", run.i))
	if err := os.MkdirAll(runDir, 0o711); err != nil {
		return err
	}
	defer os.RemoveAll(runDir)
	xml, err := tmpl.instance(name, newUUID(), runDir)
	if err != nil {
		return err
	}
	dom, err := l.DomainDefineXML(xml)
	if err != nil {
		return fmt.Errorf("define: %w", err)
	}
	defer func() {
		_ = l.DomainDestroy(dom)
		retErr = errors.Join(retErr, l.DomainUndefine(dom))
	}()
	if err = l.DomainCreate(dom); err != nil {
		return fmt.Errorf("create: %w", err)
	}
	conn, err := net.DialTimeout("unix", filepath.Join(runDir, "console.sock"), 5*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	con := &consoleBuf{}
	go func() { _, _ = io.Copy(con, bufio.NewReader(conn)) }()
	return measureGuest(ctx, guestLink{con: con, shell: conn, addr: bridgeAddr}, e.cfg.netSeconds, run.v)
}

// copyVMFiles copies a VM dir's regular files but the console's.
func copyVMFiles(vmDir, to string) error {
	if err := os.MkdirAll(to, 0o711); err != nil {
		return err
	}
	entries, err := os.ReadDir(vmDir)
	if err != nil {
		return err
	}
	for _, ent := range entries {
		if !ent.Type().IsRegular() || strings.HasPrefix(ent.Name(), "console.") {
			continue
		}
		fi, err := ent.Info()
		if err != nil {
			return err
		}
		if err := copyFile(filepath.Join(vmDir, ent.Name()), filepath.Join(to, ent.Name()), fi.Mode().Perm()); err != nil {
			return err
		}
	}
	return nil
}
