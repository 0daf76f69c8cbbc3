//go:build integration

package integration

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

const annDiskImages = "kvm.containerd.io/disk-images"

// hostVolumeDir makes a directory standing for a volume kubelet prepared:
// under /tmp, searchable by the QEMU user (t.TempDir is not), removed at
// the end of the test.
func hostVolumeDir(t *testing.T, name string) string {
	t.Helper()
	root, err := os.MkdirTemp("", "kvm-vol-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	d := filepath.Join(root, name)
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// loopDevice attaches a file of size bytes starting with first as a loop
// device: a raw block PVC.
func loopDevice(t *testing.T, size int64, first string) string {
	t.Helper()
	dev, detach, err := testenv.AttachLoop(filepath.Join(hostVolumeDir(t, "pv"), "block"), size, first)
	if err != nil {
		t.Skipf("a raw block volume needs a loop device: %v", err)
	}
	t.Cleanup(func() {
		if err := detach(); err != nil {
			t.Error(err)
		}
	})
	return dev
}

// configMapDir lays out a directory as kubelet writes a configMap volume:
// the keys are links through ..data to a timestamped directory, and an
// update swaps ..data atomically.
type configMapDir string

func (d configMapDir) write(t *testing.T, version string, keys map[string]string) {
	t.Helper()
	dir := string(d)
	ts := "..2026_11_23_" + version
	if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for k, v := range keys {
		if err := os.WriteFile(filepath.Join(dir, ts, k), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(filepath.Join(dir, k)); err != nil {
			if err := os.Symlink(filepath.Join("..data", k), filepath.Join(dir, k)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.Symlink(ts, filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
}

// firstLine reads the first line of a file or block device.
func firstLine(t *testing.T, p string) string {
	t.Helper()
	l, err := testenv.FirstLine(p)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// volumePod is the CRI config of a VM container with every volume kind:
// a writable and a read-only raw block volume (loop devices), a
// filesystem PVC holding disk.img (made on request), a configMap
// (read-only) and an emptyDir.
type volumePod struct {
	block, blockRO, pvc, cache string
	cm                         configMapDir
}

func (v volumePod) config(image string) *cri.ContainerConfig {
	cfg := containerConfig("vm", image, map[string]string{annDiskImages: "/data=32Mi"})
	cfg.Devices = []*cri.Device{
		{ContainerPath: "/dev/xvda", HostPath: v.block, Permissions: "rwm"},
		{ContainerPath: "/dev/xvdb", HostPath: v.blockRO, Permissions: "r"},
	}
	cfg.Mounts = []*cri.Mount{
		{ContainerPath: "/etc/app", HostPath: string(v.cm), Readonly: true},
		{ContainerPath: "/cache", HostPath: v.cache},
		{ContainerPath: "/data", HostPath: v.pvc},
	}
	return cfg
}

func (c *containerd) startVolumePod(t *testing.T, cl *criClient, name string, cfg *cri.ContainerConfig) *podContainer {
	t.Helper()
	return cl.startContainerIn(t, c.runPod(t, cl, name, "kvm", nil), cfg)
}

// startContainerIn creates and starts the container cfg in pod p.
func (cl *criClient) startContainerIn(t *testing.T, p *pod, cfg *cri.ContainerConfig) *podContainer {
	t.Helper()
	cid, err := cl.createContainer(p, cfg)
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	ctx, cancel := criCtx()
	defer cancel()
	if _, err := cl.Runtime.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: cid}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	return &podContainer{pod: p, cid: cid, logPath: filepath.Join(p.logDir, cfg.LogPath)}
}

// guestLine waits for the console line starting with prefix.
func guestLine(t *testing.T, v *podContainer, prefix string) string {
	t.Helper()
	l, err := waitLogMessage(v.logPath, prefix, bootTimeout)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestCRIVolumes gives a direct-boot guest every volume kind through CRI
// (mounts and devices as kubelet passes them), checks what the guest sees
// and what its writes do on the host, follows a configMap update, then
// deletes the pod and checks that a new pod with the same volumes reads
// the data the first one wrote.
func TestCRIVolumes(t *testing.T) {
	s := requireKVM(t, "kernel", "pause")
	image := s.images["kernel"].ref
	s.forEachFlavour(t, func(t *testing.T, c *containerd) {
		c.cleanupAfter(t)
		cl := c.cri(t)
		v := volumePod{
			block:   loopDevice(t, 8<<20, "KVM-GUEST-BLOCK initial\n"),
			blockRO: loopDevice(t, 8<<20, "KVM-GUEST-BLOCK read-only\n"),
			pvc:     hostVolumeDir(t, "pvc"),
			cache:   hostVolumeDir(t, "cache"),
			cm:      configMapDir(hostVolumeDir(t, "config")),
		}
		v.cm.write(t, "v1", map[string]string{"kvm-guest-read": "hello-from-configmap", "kvm-guest-watch": "v1"})

		first := c.startVolumePod(t, cl, "vm-volumes", v.config(image))
		wrote := map[string]string{}
		for _, serial := range []string{"dev-xvda", "data"} {
			f := strings.Fields(guestLine(t, first, "KVM-GUEST-DISK-WROTE "+serial+" "))
			wrote[serial] = f[2]
		}
		if l := guestLine(t, first, "KVM-GUEST-DISK dev-xvda "); !strings.HasSuffix(l, "ro=0 data=KVM-GUEST-BLOCK initial") {
			t.Errorf("raw block volume: %q, want it writable with the host's first line", l)
		}
		if l := guestLine(t, first, "KVM-GUEST-DISK dev-xvdb "); !strings.HasSuffix(l, "ro=1 data=KVM-GUEST-BLOCK read-only") {
			t.Errorf("read-only raw block volume: %q, want ro=1 with the host's first line", l)
		}
		if l := guestLine(t, first, "KVM-GUEST-DISK data "); !strings.HasSuffix(l, "ro=0 data=") {
			t.Errorf("new disk.img volume: %q, want an empty writable disk", l)
		}
		if m := logMessages(first.logPath, "KVM-GUEST-DISK-WROTE dev-xvdb"); len(m) > 0 {
			t.Errorf("the guest wrote to the read-only block volume: %q", m)
		}
		if l := guestLine(t, first, "KVM-GUEST-SHARE etc-app "); l != "KVM-GUEST-SHARE etc-app /etc/app write=fail" {
			t.Errorf("configMap share: %q, want mounted at /etc/app and not writable", l)
		}
		if l := guestLine(t, first, "KVM-GUEST-SHARE cache "); l != "KVM-GUEST-SHARE cache /cache write=ok" {
			t.Errorf("emptyDir share: %q, want mounted at /cache and writable", l)
		}
		if l := guestLine(t, first, "KVM-GUEST-FILE /etc/app/"); l != "KVM-GUEST-FILE /etc/app/kvm-guest-read hello-from-configmap" {
			t.Errorf("configMap key in the guest: %q", l)
		}
		guestLine(t, first, "KVM-GUEST-WATCH /etc/app v1")

		// The guest's writes on the host: in the emptyDir, at the start of
		// the block device and of disk.img; nothing in the configMap.
		if b, err := os.ReadFile(filepath.Join(v.cache, ".kvm-guest-wrote")); err != nil || string(b) != "cache\n" {
			t.Errorf("the guest's file in the emptyDir: %q, %v", b, err)
		}
		if _, err := os.Lstat(filepath.Join(string(v.cm), ".kvm-guest-wrote")); err == nil {
			t.Error("the guest wrote into the read-only configMap")
		}
		if l := firstLine(t, v.block); l != "KVM-GUEST-BLOCK "+wrote["dev-xvda"] {
			t.Errorf("block device on the host starts with %q, want the guest's token %s", l, wrote["dev-xvda"])
		}
		img := filepath.Join(v.pvc, "disk.img")
		if l := firstLine(t, img); l != "KVM-GUEST-BLOCK "+wrote["data"] {
			t.Errorf("disk.img on the host starts with %q, want the guest's token %s", l, wrote["data"])
		}

		// kubelet's configMap update: a new ..data, swapped atomically.
		start := time.Now()
		v.cm.write(t, "v2", map[string]string{"kvm-guest-watch": "v2"})
		guestLine(t, first, "KVM-GUEST-WATCH /etc/app v2")
		t.Logf("the guest saw the configMap update after %v", time.Since(start).Round(100*time.Millisecond))

		if err := cl.stopContainer(first); err != nil {
			t.Fatal(err)
		}
		cl.removePod(t, first)
		assertNothingLeft(t, c, first.shimIDs()...)
		if _, err := os.Stat(img); err != nil {
			t.Fatalf("disk.img went with the pod: %v", err)
		}

		// A new pod with the same volumes reads what the first one wrote.
		second := c.startVolumePod(t, cl, "vm-volumes-again", v.config(image))
		for serial, token := range wrote {
			l := guestLine(t, second, "KVM-GUEST-DISK "+serial+" ")
			if !strings.HasSuffix(l, "data=KVM-GUEST-BLOCK "+token) {
				t.Errorf("the new pod's %s: %q, want the first pod's token %s", serial, l, token)
			}
		}
		guestLine(t, second, "KVM-GUEST-DISK-WROTE data")
		if err := cl.stopContainer(second); err != nil {
			t.Error(err)
		}
		cl.removePod(t, second)
		assertNothingLeft(t, c, second.shimIDs()...)
	})
}

// volumeBadInputs are volumes the shim must refuse through CRI, naming
// the volume, leaving nothing (and no disk.img) behind.
var volumeBadInputs = []badInput{
	{name: "char-device", image: "kernel", want: []string{"/dev/vol-null", "only block devices", "invalid argument"},
		criCode: codes.InvalidArgument,
		config: func(t *testing.T, cfg *cri.ContainerConfig) {
			cfg.Devices = []*cri.Device{{ContainerPath: "/dev/vol-null", HostPath: "/dev/null", Permissions: "rw"}}
		}},
	{name: "corrupt-disk-img", image: "kernel", want: []string{"/data/disk.img", "invalid argument"}, criCode: codes.InvalidArgument,
		config: func(t *testing.T, cfg *cri.ContainerConfig) {
			d := hostVolumeDir(t, "pvc")
			if err := os.WriteFile(filepath.Join(d, "disk.img"), append([]byte("QFI\xfb\x00\x00\x00\x03"), bytes.Repeat([]byte{0xff}, 4096)...),
				0o644); err != nil {
				t.Fatal(err)
			}
			cfg.Mounts = []*cri.Mount{{ContainerPath: "/data", HostPath: d}}
		}},
	{name: "backing-file-disk-img", image: "kernel", want: []string{"/data/disk.img", "backing file", "invalid argument"},
		criCode: codes.InvalidArgument,
		config: func(t *testing.T, cfg *cri.ContainerConfig) {
			d := hostVolumeDir(t, "pvc")
			if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", "/etc/passwd",
				filepath.Join(d, "disk.img")).CombinedOutput(); err != nil {
				t.Fatalf("qemu-img: %v: %s", err, out)
			}
			cfg.Mounts = []*cri.Mount{{ContainerPath: "/data", HostPath: d}}
		}},
	{name: "size-malformed", image: "kernel", annotations: map[string]string{annDiskImages: "/data=lots"},
		want: []string{annDiskImages, "/data", "invalid argument"}, criCode: codes.InvalidArgument,
		config: func(t *testing.T, cfg *cri.ContainerConfig) {
			cfg.Mounts = []*cri.Mount{{ContainerPath: "/data", HostPath: hostVolumeDir(t, "pvc")}}
		}},
	{name: "size-too-large", image: "kernel", annotations: map[string]string{annDiskImages: "/data=1000Ti"},
		want: []string{annDiskImages, "/data", "free", "invalid argument"}, criCode: codes.InvalidArgument,
		config: func(t *testing.T, cfg *cri.ContainerConfig) {
			d := hostVolumeDir(t, "pvc")
			cfg.Mounts = []*cri.Mount{{ContainerPath: "/data", HostPath: d}}
			t.Cleanup(func() {
				if _, err := os.Stat(filepath.Join(d, "disk.img")); err == nil {
					t.Error("a refused disk.img was left on the volume")
				}
			})
		}},
	{name: "single-file", image: "kernel", want: []string{"/etc/app.conf", "regular file", "invalid argument"}, criCode: codes.InvalidArgument,
		config: func(t *testing.T, cfg *cri.ContainerConfig) {
			f := filepath.Join(hostVolumeDir(t, "cm"), "app.conf")
			if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg.Mounts = []*cri.Mount{{ContainerPath: "/etc/app.conf", HostPath: f, Readonly: true}}
		}},
	{name: "too-many-shares", image: "kernel", want: []string{"/s/17", "more than 16", "invalid argument"}, criCode: codes.InvalidArgument,
		config: func(t *testing.T, cfg *cri.ContainerConfig) {
			for i := 1; i <= 17; i++ {
				cfg.Mounts = append(cfg.Mounts, &cri.Mount{ContainerPath: fmt.Sprintf("/s/%d", i), HostPath: hostVolumeDir(t, "s"), Readonly: true})
			}
		}},
}

func TestCRIVolumeBadInput(t *testing.T) {
	runCRIBadInputs(t, volumeBadInputs)
}
