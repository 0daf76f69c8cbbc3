//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// The volumes of the volume case, as a user writes them for a node
// without a provisioner: local PersistentVolumes bound to their claims
// ahead (claimRef), a configMap, a secret and an emptyDir.
const (
	volPodName     = "vm-vol"
	volClass       = "kvm-e2e-local"
	volBlockClaim  = "vm-vol-block"
	volFSClaim     = "vm-vol-fs"
	volConfigMap   = "vm-vol-config"
	volSecret      = "vm-vol-secret"
	volBlockFirst  = "KVM-GUEST-BLOCK e2e-initial"
	volDiskImages  = "kvm.containerd.io/disk-images"
	volFSImageSize = "32Mi"
)

func storageClass() obj {
	return obj{
		"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
		"metadata":          obj{"name": volClass},
		"provisioner":       "kubernetes.io/no-provisioner",
		"volumeBindingMode": "Immediate", // no scheduler on this node
	}
}

// localPV is a local PersistentVolume at path on the node, bound ahead to
// the claim of the same name.
func localPV(name, path, mode, size string) obj {
	return obj{
		"apiVersion": "v1", "kind": "PersistentVolume",
		"metadata": obj{"name": name},
		"spec": obj{
			"capacity":                      obj{"storage": size},
			"volumeMode":                    mode,
			"accessModes":                   []string{"ReadWriteOnce"},
			"persistentVolumeReclaimPolicy": "Retain",
			"storageClassName":              volClass,
			"claimRef":                      obj{"namespace": "default", "name": name},
			"local":                         obj{"path": path},
			"nodeAffinity": obj{"required": obj{"nodeSelectorTerms": []obj{{
				"matchExpressions": []obj{{"key": "kubernetes.io/hostname", "operator": "In", "values": []string{nodeName}}},
			}}}},
		},
	}
}

func claim(name, mode, size string) obj {
	return obj{
		"apiVersion": "v1", "kind": "PersistentVolumeClaim",
		"metadata": obj{"name": name, "namespace": "default"},
		"spec": obj{
			"storageClassName": volClass,
			"volumeMode":       mode,
			"accessModes":      []string{"ReadWriteOnce"},
			"resources":        obj{"requests": obj{"storage": size}},
		},
	}
}

func configMap(name string, data map[string]string) obj {
	return obj{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": obj{"name": name, "namespace": "default"},
		"data":     data,
	}
}

func secret(name string, data map[string]string) obj {
	return obj{
		"apiVersion": "v1", "kind": "Secret",
		"metadata":   obj{"name": name, "namespace": "default"},
		"stringData": data,
	}
}

// volumePod is a direct-boot VM pod with one volume of each kind: a raw
// block PVC at /dev/xvda, a filesystem PVC at /data where the shim makes
// a disk.img (the annotation), a configMap at /etc/app, a secret at
// /etc/secret and an emptyDir at /cache. The guest's /init reports each
// on the console (hack/guest/README.md).
func volumePod() podOpts {
	return podOpts{
		name: volPodName, image: kernelImage, vm: true,
		annotations: obj{volDiskImages: "/data=" + volFSImageSize},
		volumes: []obj{
			{"name": "block", "persistentVolumeClaim": obj{"claimName": volBlockClaim}},
			{"name": "data", "persistentVolumeClaim": obj{"claimName": volFSClaim}},
			{"name": "config", "configMap": obj{"name": volConfigMap}},
			{"name": "secret", "secret": obj{"secretName": volSecret}},
			{"name": "cache", "emptyDir": obj{}},
		},
		mounts: []obj{
			{"name": "data", "mountPath": "/data"},
			{"name": "config", "mountPath": "/etc/app", "readOnly": true},
			{"name": "secret", "mountPath": "/etc/secret", "readOnly": true},
			{"name": "cache", "mountPath": "/cache"},
		},
		devices: []obj{{"name": "block", "devicePath": "/dev/xvda"}},
	}
}

// Through a real kubelet, a VM pod gets every volume kind: the guest sees
// the block PVC as a disk with its serial, the filesystem PVC as a disk on
// the disk.img the shim made there, the configMap and secret as
// read-only shares at their paths, the emptyDir as a writable share.
// kubectl exec reads and writes them; a configMap update reaches the
// guest; the guest's writes land on the host where they should; and a new
// pod with the same claims reads what the first one wrote.
func testVolumes(t *testing.T, e *env) {
	dir := volumeRoot(t, e)
	dev := loopDevice(t, filepath.Join(dir, "block.img"), 16<<20, volBlockFirst+"\n")
	fsDir := filepath.Join(dir, "fs")
	if err := os.Mkdir(fsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// The pod goes first: a claim in use is kept (pvc-protection).
	defer e.kubectl(t, "delete", "--ignore-not-found", "--wait=true", "--timeout=2m",
		"pod/"+volPodName, "pvc/"+volBlockClaim, "pvc/"+volFSClaim, "pv/"+volBlockClaim, "pv/"+volFSClaim,
		"configmap/"+volConfigMap, "secret/"+volSecret, "storageclass/"+volClass)
	e.apply(t, storageClass(),
		localPV(volBlockClaim, dev, "Block", "16Mi"), claim(volBlockClaim, "Block", "16Mi"),
		localPV(volFSClaim, fsDir, "Filesystem", "64Mi"), claim(volFSClaim, "Filesystem", "64Mi"),
		configMap(volConfigMap, map[string]string{"kvm-guest-read": "hello-from-configmap", "kvm-guest-watch": "v1"}),
		secret(volSecret, map[string]string{"kvm-guest-read": "hello-from-secret"}))
	for _, c := range []string{volBlockClaim, volFSClaim} {
		e.kubectl(t, "wait", "--for=jsonpath={.status.phase}=Bound", "pvc/"+c, "--timeout=1m")
	}

	o := volumePod()
	e.apply(t, pod(o))
	p := e.waitPod(t, o.name, bootTimeout, "Running", (*podStatus).running)
	logs := e.startStream(t, false, "logs", "-f", o.name)
	for _, want := range []string{
		"KVM-GUEST-SHARE etc-app /etc/app write=fail",
		"KVM-GUEST-FILE /etc/app/kvm-guest-read hello-from-configmap",
		"KVM-GUEST-WATCH /etc/app v1",
		"KVM-GUEST-SHARE etc-secret /etc/secret write=fail",
		"KVM-GUEST-FILE /etc/secret/kvm-guest-read hello-from-secret",
		"KVM-GUEST-SHARE cache /cache write=ok",
	} {
		if l := logs.waitLine(t, want, bootTimeout); l != want {
			t.Errorf("guest console: %q, want %q", l, want)
		}
	}
	if l := logs.waitLine(t, "KVM-GUEST-DISK dev-xvda ", bootTimeout); !strings.HasSuffix(l, "ro=0 data="+volBlockFirst) {
		t.Errorf("block PVC: %q, want a writable disk with serial dev-xvda starting %q", l, volBlockFirst)
	}
	if l := logs.waitLine(t, "KVM-GUEST-DISK data ", bootTimeout); !strings.HasSuffix(l, "ro=0 data=") {
		t.Errorf("filesystem PVC: %q, want an empty writable disk with serial data (the new disk.img)", l)
	}
	wrote := map[string]string{}
	for _, serial := range []string{"dev-xvda", "data"} {
		wrote[serial] = strings.Fields(logs.waitLine(t, "KVM-GUEST-DISK-WROTE "+serial+" ", bootTimeout))[2]
	}

	// kubectl exec sees the same volumes (the agent starts with the guest:
	// retry the first exec until it answers).
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	var got string
	if err := testenv.Poll(ctx, 500*time.Millisecond, func() (bool, string) {
		out, err := e.cluster.Kubectl(ctx, nil, "exec", o.name, "--", "cat", "/etc/app/kvm-guest-read")
		got = out
		return err == nil, fmt.Sprintf("%q %v", out, err)
	}); err != nil || got != "hello-from-configmap" {
		t.Fatalf("kubectl exec -- cat /etc/app/kvm-guest-read: %q, %v", got, err)
	}
	if out := e.kubectl(t, "exec", o.name, "--", "cat", "/etc/secret/kvm-guest-read"); out != "hello-from-secret" {
		t.Errorf("kubectl exec -- cat /etc/secret/kvm-guest-read: %q", out)
	}
	e.kubectl(t, "exec", o.name, "--", "sh", "-c", "echo from-exec-$((6*7)) >/cache/exec-wrote")
	emptyDir := filepath.Join(e.cluster.KubeletDir, "pods", p.Metadata.UID, "volumes", "kubernetes.io~empty-dir", "cache")
	if b, err := os.ReadFile(filepath.Join(emptyDir, "exec-wrote")); err != nil || string(b) != "from-exec-42\n" {
		t.Errorf("the file kubectl exec wrote in the emptyDir, on the host: %q, %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(emptyDir, ".kvm-guest-wrote")); err != nil || string(b) != "cache\n" {
		t.Errorf("the file the guest's /init wrote in the emptyDir, on the host: %q, %v", b, err)
	}
	for _, path := range []string{"/etc/app", "/etc/secret"} {
		if out, err := e.cluster.Kubectl(context.Background(), nil, "exec", o.name, "--", "sh", "-c", "echo x >"+path+"/exec-wrote"); err == nil {
			t.Errorf("kubectl exec wrote into the read-only %s: %q", path, out)
		}
	}

	// The guest's writes reached the claims' storage on the host.
	if l, err := testenv.FirstLine(dev); err != nil || l != "KVM-GUEST-BLOCK "+wrote["dev-xvda"] {
		t.Errorf("the block PV %s starts with %q (%v), want the guest's token %s", dev, l, err, wrote["dev-xvda"])
	}
	img := filepath.Join(fsDir, "disk.img")
	if l, err := testenv.FirstLine(img); err != nil || l != "KVM-GUEST-BLOCK "+wrote["data"] {
		t.Errorf("the filesystem PV's %s starts with %q (%v), want the guest's token %s", img, l, err, wrote["data"])
	}

	// kubelet's update of the configMap volume reaches the guest.
	start := time.Now()
	e.apply(t, configMap(volConfigMap, map[string]string{"kvm-guest-read": "hello-from-configmap", "kvm-guest-watch": "v2"}))
	logs.waitLine(t, "KVM-GUEST-WATCH /etc/app v2", 2*time.Minute)
	t.Logf("the guest saw the configMap update %s after kubectl apply", time.Since(start).Round(100*time.Millisecond))
	if out := e.kubectl(t, "exec", o.name, "--", "cat", "/etc/app/kvm-guest-watch"); out != "v2" {
		t.Errorf("kubectl exec -- cat /etc/app/kvm-guest-watch after the update: %q", out)
	}

	// The claims outlive the pod: a new pod reads what the first wrote.
	e.deletePod(t, o.name)
	if _, err := os.Stat(img); err != nil {
		t.Fatalf("disk.img went with the pod: %v", err)
	}
	e.apply(t, pod(o))
	e.waitPod(t, o.name, bootTimeout, "Running again", (*podStatus).running)
	logs = e.startStream(t, false, "logs", "-f", o.name)
	for serial, token := range wrote {
		if l := logs.waitLine(t, "KVM-GUEST-DISK "+serial+" ", bootTimeout); !strings.HasSuffix(l, "data=KVM-GUEST-BLOCK "+token) {
			t.Errorf("the new pod's %s: %q, want the first pod's token %s", serial, l, token)
		}
	}
	logs.waitLine(t, "KVM-GUEST-SHARE cache /cache write=ok", bootTimeout)

	// kubelet holds a mapped block volume open through a loop device of
	// its own; it must go with the pod, or the PV's device stays busy.
	if l := e.kubeletLoops(t); len(l) != 1 {
		t.Errorf("kubelet's loop devices while the pod runs: %q, want the one over the block PV", l)
	}
	e.deletePod(t, o.name)
	if l := e.kubeletLoops(t); len(l) > 0 {
		t.Errorf("loop devices over kubelet's files left once the pod is gone: %q", l)
	}
}

// kubeletLoops lists the loop devices whose backing file is kubelet's.
func (e *env) kubeletLoops(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE").Output()
	if err != nil {
		t.Fatalf("losetup --list: %v", err)
	}
	var loops []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, e.cluster.KubeletDir) {
			loops = append(loops, strings.Join(strings.Fields(l), " "))
		}
	}
	return loops
}

// volumeRoot is a directory for the case's PersistentVolumes, which the
// QEMU user can search (the suite's tmp is 0755; t.TempDir is not),
// removed at the end of the test.
func volumeRoot(t *testing.T, e *env) string {
	t.Helper()
	d := filepath.Join(suite.tmp, e.name, "volumes")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// loopDevice attaches a file of size bytes starting with first as a loop
// device (a local block PersistentVolume), detached at the end of the test.
func loopDevice(t *testing.T, file string, size int64, first string) string {
	t.Helper()
	dev, detach, err := testenv.AttachLoop(file, size, first)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := detach(); err != nil {
			t.Error(err)
		}
	})
	return dev
}
