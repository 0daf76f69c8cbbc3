//go:build integration

package integration

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// cloudBootTimeout bounds a Debian cloud-init boot under TCG (about 80 s on
// a quiet host, see hack/cloudimage/README.md; several minutes when two
// boot at once on a busy host).
const cloudBootTimeout = 10 * time.Minute

// cloudBootsAtOnce is how many cloud guests TestCRICloudInit boots at once,
// all flavours together (cloudBootSlots): under TCG each vCPU takes a host
// core, and CI hosts have two.
const cloudBootsAtOnce = 2

// cloudBootSlots is TestCRICloudInit's pool of boots, shared by its
// flavours, which run at once (forEachFlavourAtOnce): while one flavour
// makes or removes its pods one after another, or has a single guest left,
// the other's guests use the cores.
var cloudBootSlots = make(chan struct{}, cloudBootsAtOnce)

// cloudPod is one pod of TestCRICloudInit: the suite's bridge network
// (shape nil) or one of cniShapes.
type cloudPod struct {
	shape *cniShape
	// k is the index the shape's networks are made with (subnets,
	// gateways, host links): TestCRINetworkShapes runs its shapes one
	// after another with the flavour's index, but here all pods are up
	// at once and ptp, calico and cilium would share one ptp range.
	k   int
	p   *pod
	ips []string
}

func (cp *cloudPod) name() string {
	if cp.shape == nil {
		return "bridge"
	}
	return cp.shape.name
}

// network is the pod's CNI network name and plugins ("" for the suite's).
func (cp *cloudPod) network(c *containerd) (name, plugins string) {
	if cp.shape == nil {
		return "", ""
	}
	name = "kvmshape-" + cp.shape.name
	return name, cp.shape.plugins(cp.k, filepath.Join(c.IPAMDir, name))
}

// gateways are the guest's default gateways ("" none).
func (cp *cloudPod) gateways(c *containerd) (gw4, gw6 string) {
	if cp.shape == nil {
		return c.gateway(), ""
	}
	return canon(cp.shape.gw4(cp.k)), canon(cp.shape.gw6(cp.k))
}

// cloudShapeOnFlavour tells whether TestCRICloudInit boots cniShapes[i] on
// the flavour with index k of n: each shape on one flavour, in turn (all
// of them when one flavour runs). What a cloud guest makes of a shape is
// the config drive's network data, which no containerd version changes;
// the shape's plumbing on every flavour is TestCRINetworkShapes' (busybox
// guests, every shape on both). Each cloud boot costs about 80 s of a
// core under TCG: this took five of twelve boots out of make test.
func cloudShapeOnFlavour(i, k, n int) bool {
	return n < 2 || i%n == k
}

// TestCRICloudInit boots an unchanged Debian cloud image (its own
// bootloader, cloud-init with the ConfigDrive datasource) on each
// flavour, once in the suite's bridge network (with the pod's volumes)
// and once in each of its share of cniShapes (cloudShapeOnFlavour: one
// pod per shape, as a new user would try it), at most cloudBootsAtOnce
// at a time. For each it checks what cloud-init made of
// the config drive: the hostname, the SSH key, every pod address, the
// default routes (the guest reaches the host through each family's), the
// pod's DNS, and the host reaches the guest on every pod address (ping and
// sshd). The bridge pod also carries the pod's volumes: shares mounted at
// their container paths (read-only where they are), the guest's write in
// the emptyDir seen on the host, a raw block volume at
// /dev/disk/by-id/virtio-<serial>. systemd powers each guest off on the
// ACPI button (exit code 0) and nothing is left once the pods are gone.
// The bridge pod's guest also answers ExecSync through the image's own
// qemu-guest-agent service (started by udev and systemd), which had a
// test and a cloud boot of its own before (TestCRIExecCloud).
//
// CRI sets a pod's network up in RunPodSandbox and tears it down in
// StopPodSandbox with the CNI configuration loaded at that moment, and it
// loads one network at a time: the pods are made one after another, each
// with its shape's network loaded, the guests then boot in parallel, and
// the pods are removed one after another, each with its network loaded
// again. The flavours run at once, their boots drawn from cloudBootSlots.
func TestCRICloudInit(t *testing.T) {
	s := requireCloudImage(t)
	if s.cniErr != nil {
		t.Fatal(s.cniErr)
	}
	userData := func(ht hostTargets) string { return cloudShapeUserData(t, s.repo, ht) }
	key := testSSHKey(t)
	s.forEachFlavourAtOnce(t, func(t *testing.T, c *containerd) {
		c.cleanupAfter(t)
		cl := c.cri(t)
		k := c.flavourIndex()
		ht := c.startHostTargets(t)
		started := time.Now()
		pods := []*cloudPod{{}}
		for i := range cniShapes {
			if !cloudShapeOnFlavour(i, k, len(c.suite.flavours)) {
				continue
			}
			cp := &cloudPod{shape: &cniShapes[i], k: 2*(i+1) + k} // 2.., apart from both flavours' own
			pods = append(pods, cp)
			if links := cniShapes[i].hostLinks; links != nil {
				t.Cleanup(func() {
					for _, l := range links(cp.k) {
						_ = exec.Command("ip", "link", "del", l).Run()
					}
				})
			}
		}
		annotations := map[string]string{
			"kvm.containerd.io/user-data":           userData(ht),
			"kvm.containerd.io/ssh-authorized-keys": key,
		}
		// withNetwork runs f with cp's network loaded in CRI.
		withNetwork := func(cp *cloudPod, f func()) {
			name, plugins := cp.network(c)
			if name == "" {
				f()
				return
			}
			unload := c.loadCNI(t, cl, name, plugins)
			defer func() {
				if err := unload(); err != nil {
					t.Error(err)
				}
			}()
			f()
		}
		for _, cp := range pods {
			withNetwork(cp, func() {
				cp.p = c.runPodWith(t, cl, "cloud-"+cp.name(), "kvm", annotations, shapeDNS)
				cp.ips = cl.podIPs(t, cp.p)
			})
		}
		var shims []shimID
		var guests []*podContainer
		t.Run("guests", func(t *testing.T) {
			for _, cp := range pods {
				v := &podContainer{pod: cp.p}
				guests = append(guests, v)
				t.Run(cp.name(), func(t *testing.T) {
					t.Parallel()
					cloudBootSlots <- struct{}{}
					defer func() { <-cloudBootSlots }()
					c.checkCloudPod(t, cl, cp, v, ht, key)
				})
			}
		})
		for i, cp := range pods {
			withNetwork(cp, func() {
				if v := guests[i]; v.cid != "" {
					cl.removePod(t, v)
					shims = append(shims, v.shimIDs()...)
				} else {
					cl.stopAndRemovePod(t, cp.p)
					shims = append(shims, shimID{nsCRI, cp.p.id})
				}
			})
		}
		t.Logf("%d cloud guests, %d at a time: %v from the first pod to the last removed",
			len(pods), cloudBootsAtOnce, time.Since(started).Round(time.Second))
		assertNothingLeft(t, c, shims...)
	})
}

// checkCloudPod starts the cloud image in cp's pod (v.cid is set once it
// is created) and checks the guest, then stops it.
func (c *containerd) checkCloudPod(t *testing.T, cl *criClient, cp *cloudPod, v *podContainer, ht hostTargets, key string) {
	t.Helper()
	netns := c.podNetnsOf(t, cp.p)
	cfg := containerConfig("vm", c.suite.images["cloud"].ref, nil)
	cfg.Linux.Resources.MemoryLimitInBytes = 1 << 30
	var checkVolumes func(got map[string][]string)
	if cp.shape == nil {
		checkVolumes = cloudVolumes(t, cfg)
	}
	*v = *c.startContainerIn(t, cl, cp.p, cfg)
	start := time.Now()
	if err := waitLog(v.logPath, "KVM-CLOUD-DONE", cloudBootTimeout); err != nil {
		t.Fatal(err)
	}
	t.Logf("cloud-init done %v after StartContainer", time.Since(start).Round(time.Second))
	got := cloudConsole(t, v.logPath)
	t.Logf("cloud guest: %v", got)
	for k, w := range map[string]string{
		"KVM-CLOUD-USERDATA-RAN": "",
		"KVM-CLOUD-HOSTNAME":     "cloud-" + cp.name(),
		"KVM-CLOUD-SSHKEY":       key,
	} {
		if vals, ok := got[k]; !ok || (w != "" && !contains(vals, w)) {
			t.Errorf("%s = %q, want %q", k, vals, w)
		}
	}
	for _, ifc := range podInterfaces(t, netns) {
		for _, a := range ifc.addrs {
			if !containsPrefix(got["KVM-CLOUD-ADDR"], a.Addr().String()+"/") {
				t.Errorf("cloud guest addresses %q lack %s of pod interface %s", got["KVM-CLOUD-ADDR"], a, ifc.name)
			}
		}
	}
	gw4, gw6 := cp.gateways(c)
	if gw4 != "" && !contains(got["KVM-CLOUD-GW4"], gw4) {
		t.Errorf("cloud guest IPv4 default gateways %q, want %s", got["KVM-CLOUD-GW4"], gw4)
	}
	if gw6 != "" && !contains(got["KVM-CLOUD-GW6"], gw6) {
		t.Errorf("cloud guest IPv6 default gateways %q, want %s", got["KVM-CLOUD-GW6"], gw6)
	}
	for _, d := range shapeDNS.Servers {
		if !contains(got["KVM-CLOUD-DNS"], d) {
			t.Errorf("cloud guest DNS %q lacks the pod's %s", got["KVM-CLOUD-DNS"], d)
		}
	}
	for _, d := range shapeDNS.Searches {
		if !contains(got["KVM-CLOUD-SEARCH"], d) {
			t.Errorf("cloud guest search domains %q lack the pod's %s", got["KVM-CLOUD-SEARCH"], d)
		}
	}
	// Through the default route of each of the pod's families the guest
	// reaches an address of the host outside its prefixes.
	for _, ip := range cp.ips {
		target := ht.v4
		if strings.Contains(ip, ":") {
			target = ht.v6
		}
		if !contains(got["KVM-CLOUD-REACH-OK"], target) {
			t.Errorf("cloud guest (%s) did not reach the host at %s through its default route (REACH-FAIL %q)", ip, target,
				got["KVM-CLOUD-REACH-FAIL"])
		}
	}
	for _, ip := range append(cp.ips, net1Addrs(t, netns)...) {
		if err := ping(ip, netTimeout); err != nil {
			t.Errorf("the host pinging the cloud guest: %v", err)
		}
		if err := sshBanner(ip); err != nil {
			t.Errorf("the cloud guest's sshd on %s: %v", ip, err)
		}
	}
	if checkVolumes != nil {
		checkVolumes(got)
	}
	if cp.shape == nil {
		checkCloudExec(t, cl, v.cid)
	}
	// systemd powers the guest off on the ACPI button.
	stopCtx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := cl.Runtime.StopContainer(stopCtx, &cri.StopContainerRequest{ContainerId: v.cid, Timeout: 120}); err != nil {
		t.Fatalf("StopContainer: %v", err)
	}
	if st := cl.containerStatus(t, v.cid); st.ExitCode != 0 {
		t.Errorf("exit code %d after an ACPI power-off, want 0", st.ExitCode)
	}
	if err := waitNetnsClean(netns); err != nil {
		t.Error(err)
	}
}

// checkCloudExec: the Debian cloud image's own qemu-guest-agent service
// (started by udev and systemd) answers ExecSync, with the command's
// output and exit code.
func checkCloudExec(t *testing.T, cl *criClient, cid string) {
	t.Helper()
	cl.waitAgentCRI(t, cid, cloudBootTimeout)
	r, err := cl.execSync(cid, 30, "systemctl", "is-active", "qemu-guest-agent")
	if err != nil || r.ExitCode != 0 || strings.TrimSpace(string(r.Stdout)) != "active" {
		t.Errorf("qemu-guest-agent service: %v %v", r, err)
	}
	r, err = cl.execSync(cid, 30, "sh", "-c", ". /etc/os-release; echo $VERSION_CODENAME; exit 4")
	if err != nil || r.ExitCode != 4 || strings.TrimSpace(string(r.Stdout)) != "bookworm" {
		t.Errorf("ExecSync in the cloud guest: %v %v", r, err)
	}
}

// cloudVolumes gives cfg a configMap at /etc/app (read-only), an emptyDir
// at /cache and a raw block volume at /dev/xvda, and returns the check of
// what the cloud guest reported of them.
func cloudVolumes(t *testing.T, cfg *cri.ContainerConfig) func(got map[string][]string) {
	t.Helper()
	cm, cache := configMapDir(hostVolumeDir(t, "config")), hostVolumeDir(t, "cache")
	cm.write(t, "v1", map[string]string{"kvm-guest-read": "hello-cloud"})
	cfg.Mounts = []*cri.Mount{{ContainerPath: "/etc/app", HostPath: string(cm), Readonly: true}, {ContainerPath: "/cache", HostPath: cache}}
	cfg.Devices = []*cri.Device{{ContainerPath: "/dev/xvda", HostPath: loopDevice(t, 8<<20, ""), Permissions: "rwm"}}
	return func(got map[string][]string) {
		for k, w := range map[string]string{
			"KVM-CLOUD-SHARE": "etc-app /etc/app virtiofs ro",
			"KVM-CLOUD-FILE":  "/etc/app/kvm-guest-read hello-cloud",
		} {
			if !contains(got[k], w) {
				t.Errorf("%s = %q, want %q", k, got[k], w)
			}
		}
		if !contains(got["KVM-CLOUD-SHARE"], "cache /cache virtiofs rw") {
			t.Errorf("KVM-CLOUD-SHARE = %q, want the emptyDir writable at /cache", got["KVM-CLOUD-SHARE"])
		}
		if b, err := os.ReadFile(filepath.Join(cache, ".kvm-cloud-wrote")); err != nil || string(b) != "cloud\n" {
			t.Errorf("the guest's file in the emptyDir: %q, %v", b, err)
		}
		if !containsPrefix(got["KVM-CLOUD-DISK"], "dev-xvda /dev/vd") {
			t.Errorf("KVM-CLOUD-DISK = %q, want the block volume under its serial", got["KVM-CLOUD-DISK"])
		}
	}
}

// sshBanner connects to sshd at ip:22 and reads its banner.
func sshBanner(ip string) error {
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(ip, "22"), 10*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	banner, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || !strings.HasPrefix(banner, "SSH-2.0-") {
		return fmt.Errorf("sshd banner %q, %v", banner, err)
	}
	return nil
}

// cloudShapeUserData is the cloud image's user-data plus probes of the
// host targets through the guest's default routes.
func cloudShapeUserData(t *testing.T, repo string, ht hostTargets) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, "hack/cloudimage/user-data.sh"))
	if err != nil {
		t.Fatal(err)
	}
	ud := strings.Replace(string(b), `say "DONE"`, fmt.Sprintf(`for t in %s %s; do
	if timeout 10 bash -c 'exec 3<>/dev/tcp/'"$t"'/%d && echo probe >&3 && read -r r <&3 && [ "$r" = probe ]'; then
		say "REACH-OK $t"
	else
		say "REACH-FAIL $t"
	fi
done
say "DONE"`, ht.v4, ht.v6, ht.port), 1)
	if ud == string(b) {
		t.Fatal(`hack/cloudimage/user-data.sh has no line say "DONE"`)
	}
	return ud
}

// requireCloudImage is requireKVM for the Debian cloud image: it skips
// without the image, and fails without it in CI.
func requireCloudImage(t *testing.T) *testSuite {
	t.Helper()
	s := requireKVM(t, "pause")
	if _, ok := s.images["cloud"]; !ok {
		if os.Getenv("CI") != "" {
			t.Fatalf("cloud image missing in %s: build it with hack/cloudimage/build.sh (make images)", s.imagesDir)
		}
		t.Skip("cloud image not built (hack/cloudimage/build.sh)")
	}
	return s
}

// cloudConsole collects the KVM-CLOUD-* lines of the CRI log: key → values.
func cloudConsole(t *testing.T, path string) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimRight(line, "\r")
		i := strings.Index(line, "KVM-CLOUD-")
		if i < 0 {
			continue
		}
		k, v, _ := strings.Cut(line[i:], " ")
		out[k] = append(out[k], strings.TrimSpace(strings.TrimRight(v, "\r")))
	}
	return out
}

func contains(vals []string, want string) bool {
	for _, v := range vals {
		if v == want {
			return true
		}
	}
	return false
}

func containsPrefix(vals []string, prefix string) bool {
	for _, v := range vals {
		if strings.HasPrefix(v, prefix) {
			return true
		}
	}
	return false
}
