//go:build integration

package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// badInput is a VM container that the shim must refuse with a message
// naming the problem.
type badInput struct {
	name        string
	image       string // short name in knownImages
	annotations map[string]string
	want        []string // substrings of the error
	// criCode, when set, is the gRPC code CRI must return.
	criCode codes.Code
	// config, when set, changes the container's CRI config (volumes).
	config func(t *testing.T, cfg *cri.ContainerConfig)
}

var badInputs = []badInput{
	{name: "nodisk", image: "nodisk", want: []string{"/disk/"}},
	{name: "twodisks", image: "twodisks", want: []string{"a.qcow2", "b.raw"}},
	{name: "escape", image: "escape", want: []string{"outside the container rootfs"}},
	{name: "corrupt", image: "corrupt", want: []string{"guest.qcow2"}},
	{name: "memory", image: "kernel", annotations: map[string]string{"kvm.containerd.io/memory": "lots"},
		want: []string{"kvm.containerd.io/memory"}, criCode: codes.InvalidArgument},
	{name: "userdata-too-big", image: "kernel",
		annotations: map[string]string{annUserData: strings.Repeat("x", 64<<10+1)},
		want:        []string{annUserData, "invalid argument"}, criCode: codes.InvalidArgument},
	{name: "ssh-key", image: "kernel", annotations: map[string]string{annSSHKeys: "ssh-ed25519 not-base64!! it@kvm-shim"},
		want: []string{annSSHKeys, "invalid argument"}, criCode: codes.InvalidArgument},
	{name: "numa-mode", image: "kernel", annotations: map[string]string{"kvm.containerd.io/numa-mode": "fast"},
		want: []string{"kvm.containerd.io/numa-mode", "invalid argument"}, criCode: codes.InvalidArgument},
}

// missingWords returns the wanted substrings msg lacks.
func missingWords(msg string, want []string) []string {
	var missing []string
	for _, w := range want {
		if !strings.Contains(msg, w) {
			missing = append(missing, w)
		}
	}
	return missing
}

// TestCtrBadInput: `ctr run -d` fails with a message naming the problem, and
// deleting the container leaves nothing behind.
func TestCtrBadInput(t *testing.T) {
	for _, tc := range badInputs {
		t.Run(tc.name, func(t *testing.T) {
			s := requireKVM(t, tc.image)
			s.forEachFlavour(t, func(t *testing.T, c *containerd) {
				c.cleanupAfter(t)
				var args []string
				for k, v := range tc.annotations {
					args = append(args, "--annotation", k+"="+v)
				}
				c.ctrRunFails(t, "it-bad-"+tc.name, tc.image, args, tc.want)
			})
		})
	}
}

// ctrRunFails runs `ctr run -d [args] <image> <id>` with the kvm shim,
// expects it to fail with an error holding every word of want, deletes the
// container record ctr leaves and checks that nothing else is left.
func (c *containerd) ctrRunFails(t *testing.T, id, image string, args, want []string) {
	t.Helper()
	run := append(append([]string{"run", "-d"}, args...), c.kvmRun(c.suite.images[image].ref, id)...)
	r := c.ctr(nsDefault, run...)
	if r.Err == nil || r.Code == 0 {
		t.Fatalf("want ctr run to fail: %v", r)
	}
	if m := missingWords(r.Stderr, want); len(m) > 0 {
		t.Errorf("error lacks %q: %v", m, r)
	}
	t.Logf("ctr run failed: %.400s", strings.TrimSpace(r.Stderr))
	// ctr run leaves the container record when the task fails.
	if ls := c.mustCtr(t, nsDefault, "containers", "ls", "-q"); strings.Contains(ls.Stdout, id) {
		c.mustCtr(t, nsDefault, "containers", "delete", id)
	}
	assertNothingLeft(t, c, shimID{nsDefault, id})
}

// newNetns makes a network namespace for a test with `ip netns add` and
// returns its path. Each name in ifs becomes an interface in it: one end
// of a veth pair, as CNI makes, whose other end waits in a second
// namespace (the kernel here has no dummy interfaces). Both are deleted at
// the end of t.
func newNetns(t *testing.T, name string, ifs ...string) string {
	t.Helper()
	name = fmt.Sprintf("kvm-it-%s-%d", name, os.Getpid())
	peers := name + "-peers"
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	for _, ns := range []string{name, peers} {
		ip("netns", "add", ns)
		t.Cleanup(func() {
			if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
				t.Errorf("ip netns del %s: %v: %s", ns, err, out)
			}
		})
	}
	for i, ifc := range ifs {
		ip("-n", name, "link", "add", ifc, "type", "veth", "peer", "name", fmt.Sprintf("peer%d", i), "netns", peers)
	}
	return "/run/netns/" + name
}

// TestCtrBadNetns: a VM container started with `ctr run --with-ns
// network:<path>` into a namespace the shim cannot take over fails with a
// message naming the problem, and leaves nothing: no TAP, no qdisc or
// filter in the namespace, no descriptor socket, domain, mount or state.
func TestCtrBadNetns(t *testing.T) {
	for _, tc := range []struct {
		name string
		ifs  []string // dummy interfaces; nil with missing: no namespace at all
		// missing: the path names no namespace
		missing bool
		want    []string // besides the path, which every error must name
	}{
		{name: "missing", missing: true, want: []string{"does not exist"}},
		{name: "loopback", want: []string{"no CNI interface"}},
		// Two interfaces are two NICs now; neither has an address here.
		{name: "noaddr", ifs: []string{"kvmit0", "kvmit1"}, want: []string{"kvmit0", "no IP address"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := requireKVM(t, "kernel")
			var path string
			if tc.missing {
				path = fmt.Sprintf("/run/netns/kvm-it-missing-%d", os.Getpid())
			} else {
				path = newNetns(t, tc.name, tc.ifs...)
			}
			s.forEachFlavour(t, func(t *testing.T, c *containerd) {
				c.cleanupAfter(t)
				c.ctrRunFails(t, "it-netns-"+tc.name, "kernel", []string{"--with-ns", "network:" + path},
					append([]string{path}, tc.want...))
				if !tc.missing {
					if left := netnsLeftovers(path); len(left) > 0 {
						t.Errorf("left in the namespace:\n  %s", strings.Join(left, "\n  "))
					}
				}
			})
		})
	}
}

// TestCtrNoTun: with /dev/net/tun unusable, a VM container with a network
// fails with an error that names /dev/net/tun, and leaves nothing. It runs
// a private containerd 1.6 in a mount namespace of its own, where
// /dev/net/tun is first /dev/null (not a TUN device), then missing; the
// shims it starts inherit that, the host keeps its /dev/net/tun.
func TestCtrNoTun(t *testing.T) {
	s := requireKVM(t, "kernel")
	// The namespace must exist before containerd's mount namespace is made:
	// mounts made on the host later do not reach a private namespace.
	path := newNetns(t, "notun", "eth0")
	// An address, so that the pod network is usable and the TAP is the
	// first thing that fails.
	for _, args := range [][]string{
		{"-n", filepath.Base(path), "addr", "add", "10.89.3.2/24", "dev", "eth0"},
		{"-n", filepath.Base(path), "link", "set", "eth0", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	f, err := testenv.LookupFlavour("1.6")
	if err != nil {
		t.Fatal(err)
	}
	f.Name = "1.6-notun"
	c, err := startContainerd(s, f, testenv.Options{
		Bridge: "kvmtest2", Subnet: "10.89.2.0/24",
		MountSetup: "mount --bind /dev/null /dev/net/tun",
	})
	t.Cleanup(func() {
		if c != nil {
			if stopErr := c.Stop(); stopErr != nil {
				t.Errorf("stop containerd %s: %v", f.Name, stopErr)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	c.mustCtr(t, nsDefault, "images", "import", s.images["kernel"].archive)
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Fatalf("the host lost /dev/net/tun: %v", err)
	}
	for _, tc := range []struct {
		name, setup string // setup runs in containerd's mount namespace first
	}{
		{name: "not-a-tun"},
		{name: "missing", setup: "umount /dev/net/tun && mount -t tmpfs -o mode=0755 tmpfs /dev/net"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c.watch(t)
			c.cleanupAfter(t)
			if tc.setup != "" {
				if err := c.inMountNS(tc.setup); err != nil {
					t.Fatal(err)
				}
			}
			c.ctrRunFails(t, "it-notun-"+tc.name, "kernel", []string{"--with-ns", "network:" + path},
				[]string{"/dev/net/tun"})
			if left := netnsLeftovers(path); len(left) > 0 {
				t.Errorf("left in the namespace:\n  %s", strings.Join(left, "\n  "))
			}
		})
	}
	if fi, err := os.Stat("/dev/net/tun"); err != nil {
		t.Errorf("the host lost /dev/net/tun: %v", err)
	} else if fi.Mode()&os.ModeCharDevice == 0 {
		t.Errorf("the host's /dev/net/tun is no longer a character device: %v", fi.Mode())
	}
}

// TestCRIBadInput: the VM container is refused through CRI. containerd's
// CRI creates the task (and so calls the shim) in StartContainer, not in
// CreateContainer, so the error may come from either call; the first error
// must name the problem.
func TestCRIBadInput(t *testing.T) {
	runCRIBadInputs(t, badInputs)
}

func runCRIBadInputs(t *testing.T, cases []badInput) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := requireKVM(t, tc.image, "pause")
			s.forEachFlavour(t, func(t *testing.T, c *containerd) {
				c.cleanupAfter(t)
				cl := c.cri(t)
				p := c.runPod(t, cl, "bad-"+tc.name, "kvm", nil)
				ids := []shimID{{nsCRI, p.id}}
				cfg := containerConfig("vm", s.images[tc.image].ref, tc.annotations)
				if tc.config != nil {
					tc.config(t, cfg)
				}
				cid, err := cl.createContainer(p, cfg)
				call := "CreateContainer"
				if err == nil {
					ids = append(ids, shimID{nsCRI, cid})
					ctx, cancel := criCtx()
					_, err = cl.Runtime.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: cid})
					cancel()
					call = "StartContainer"
				}
				if err == nil {
					t.Fatalf("CreateContainer and StartContainer of %s succeeded, want an error", tc.name)
				}
				if m := missingWords(err.Error(), tc.want); len(m) > 0 {
					t.Errorf("%s error lacks %q: %v%s", call, m, err, noCommandHint(err))
				}
				if tc.criCode != codes.OK && status.Code(err) != tc.criCode {
					t.Errorf("%s error has code %s, want %s: %v", call, status.Code(err), tc.criCode, err)
				}
				t.Logf("%s failed as wanted: %v", call, err)
				if cid != "" {
					ctx, cancel := criCtx()
					if _, err := cl.Runtime.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: cid}); err != nil {
						t.Errorf("RemoveContainer %s: %v", cid, err)
					}
					cancel()
				}
				cl.stopAndRemovePod(t, p)
				assertNothingLeft(t, c, ids...)
			})
		})
	}
}
