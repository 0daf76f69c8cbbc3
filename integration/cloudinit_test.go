//go:build integration

package integration

import (
	"bufio"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// cloudBootTimeout bounds a Debian cloud-init boot under TCG (about 80 s on
// a quiet host, see hack/cloudimage/README.md).
const cloudBootTimeout = 10 * time.Minute

// TestCRICloudInit boots an unchanged Debian cloud image (its own
// bootloader, cloud-init with the ConfigDrive datasource) as a pod and
// checks from the host that cloud-init applied the hostname, the SSH key,
// the pod network, mounted the pod's shared volumes at their container
// paths (read-only where they are) and ran the user-data script; a raw
// block volume is at /dev/disk/by-id/virtio-<serial>. It runs on one flavour:
// the config drive does not depend on containerd's version, and the boot
// takes minutes under TCG.
func TestCRICloudInit(t *testing.T) {
	s := requireCloudImage(t)
	c := s.flavours[0]
	t.Run(c.Flavour.Name, func(t *testing.T) {
		c.watch(t)
		c.cleanupAfter(t)
		cl := c.cri(t)
		userData, err := os.ReadFile(filepath.Join(s.repo, "hack/cloudimage/user-data.sh"))
		if err != nil {
			t.Fatal(err)
		}
		key := testSSHKey(t)
		p := c.runPod(t, cl, "cloud-vm", "kvm", map[string]string{
			"kvm.containerd.io/user-data":           string(userData),
			"kvm.containerd.io/ssh-authorized-keys": key,
		})
		pn := cl.podNetwork(t, p)
		cfg := containerConfig("vm", s.images["cloud"].ref, nil)
		cfg.Linux.Resources.MemoryLimitInBytes = 1 << 30
		cm, cache := configMapDir(hostVolumeDir(t, "config")), hostVolumeDir(t, "cache")
		cm.write(t, "v1", map[string]string{"kvm-guest-read": "hello-cloud"})
		cfg.Mounts = []*cri.Mount{{ContainerPath: "/etc/app", HostPath: string(cm), Readonly: true}, {ContainerPath: "/cache", HostPath: cache}}
		cfg.Devices = []*cri.Device{{ContainerPath: "/dev/xvda", HostPath: loopDevice(t, 8<<20, ""), Permissions: "rwm"}}
		v := cl.startContainerIn(t, p, cfg)
		cid := v.cid
		t.Cleanup(func() {
			if t.Failed() {
				b, err := os.ReadFile(v.logPath)
				t.Logf("CRI log %s (tail, %v):\n%s", v.logPath, err, testenv.Tail(string(b), 60))
			}
		})
		start := time.Now()
		if err := waitLog(v.logPath, "KVM-CLOUD-DONE", cloudBootTimeout); err != nil {
			t.Fatal(err)
		}
		t.Logf("cloud-init done %v after StartContainer", time.Since(start).Round(time.Second))

		got := cloudConsole(t, v.logPath)
		want := map[string]string{
			"KVM-CLOUD-USERDATA-RAN": "",
			"KVM-CLOUD-HOSTNAME":     "cloud-vm",
			"KVM-CLOUD-GW4":          c.gateway(),
			"KVM-CLOUD-SSHKEY":       key,
		}
		for k, w := range want {
			vals, ok := got[k]
			if !ok {
				t.Errorf("console has no %s line", k)
				continue
			}
			if w != "" && !contains(vals, w) {
				t.Errorf("%s = %q, want %q", k, vals, w)
			}
		}
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
		if addrs := got["KVM-CLOUD-ADDR"]; !containsPrefix(addrs, pn.ip+"/") {
			t.Errorf("guest addresses %q lack the pod IP %s", addrs, pn.ip)
		}

		// The host reaches the guest's sshd on the pod IP.
		conn, err := net.DialTimeout("tcp", net.JoinHostPort(pn.ip, "22"), 10*time.Second)
		if err != nil {
			t.Fatalf("connect to the guest's sshd on the pod IP: %v", err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		banner, err := bufio.NewReader(conn).ReadString('\n')
		conn.Close()
		if err != nil || !strings.HasPrefix(banner, "SSH-2.0-") {
			t.Errorf("sshd banner %q, %v", banner, err)
		}

		// systemd powers the guest off on the ACPI button.
		stopCtx, stopCancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer stopCancel()
		if _, err := cl.Runtime.StopContainer(stopCtx, &cri.StopContainerRequest{ContainerId: cid, Timeout: 120}); err != nil {
			t.Fatalf("StopContainer: %v", err)
		}
		if st := cl.containerStatus(t, cid); st.ExitCode != 0 {
			t.Errorf("exit code %d after an ACPI power-off, want 0", st.ExitCode)
		}
		cl.removePod(t, v)
		assertNothingLeft(t, c, v.shimIDs()...)
	})
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

// startCloudVM creates and starts a container of the cloud image (1 GiB of
// memory: cloud-init and systemd need it) in pod p.
func (cl *criClient) startCloudVM(t *testing.T, p *pod, ref string) *podContainer {
	t.Helper()
	cfg := containerConfig("vm", ref, nil)
	cfg.Linux.Resources.MemoryLimitInBytes = 1 << 30
	return cl.startContainerIn(t, p, cfg)
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
