//go:build integration

package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestCRIPod drives one VM pod through the CRI calls kubelet makes, on a
// node where the shim has never run (no state_dir yet): on a Kubernetes
// node the first call the shim sees is a CRI sandbox, not a VM.
func TestCRIPod(t *testing.T) {
	s := requireKVM(t, "kernel", "pause")
	s.forEachFlavour(t, func(t *testing.T, c *containerd) {
		c.freshShimState(t) // first: its cleanup runs after cleanupAfter's
		c.cleanupAfter(t)
		cl := c.cri(t)
		v := c.startPodContainer(t, cl, "vm-pod", "kvm", s.images["kernel"].ref)
		cl.waitContainerState(t, v.cid, cri.ContainerState_CONTAINER_RUNNING, bootTimeout)
		if err := waitLog(v.logPath, readyLine, bootTimeout); err != nil {
			t.Fatal(err)
		}

		cl.waitStats(t, v.cid)

		if err := cl.stopContainer(v); err != nil {
			t.Fatal(err)
		}
		if err := waitLog(v.logPath, poweroffLine, time.Second); err != nil {
			t.Errorf("guest did not log its ACPI power-off: %v", err)
		}
		cl.removePod(t, v)
		assertNothingLeft(t, c, v.shimIDs()...)
	})
}

// TestCRITwoPods runs two VM pods at once and stops them concurrently.
func TestCRITwoPods(t *testing.T) {
	s := requireKVM(t, "kernel", "pause")
	s.forEachFlavour(t, func(t *testing.T, c *containerd) {
		c.cleanupAfter(t)
		cl := c.cri(t)
		vms := []*podContainer{
			c.startPodContainer(t, cl, "vm-a", "kvm", s.images["kernel"].ref),
			c.startPodContainer(t, cl, "vm-b", "kvm", s.images["kernel"].ref),
		}
		for _, v := range vms {
			if err := waitLog(v.logPath, readyLine, bootTimeout); err != nil {
				t.Fatal(err)
			}
		}
		errs := make([]error, len(vms))
		var wg sync.WaitGroup
		for i, v := range vms {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = cl.stopContainer(v)
			}()
		}
		wg.Wait()
		var ids []shimID
		for i, v := range vms {
			if errs[i] != nil {
				t.Errorf("pod %s: %v", v.config.Metadata.Name, errs[i])
			}
			cl.removePod(t, v)
			ids = append(ids, v.shimIDs()...)
		}
		assertNothingLeft(t, c, ids...)
	})
}

// TestCRIRestartKeepsDisk restarts a pod's VM container as kubelet does:
// the old container exits (CRI deletes its task and so its runtime dir),
// and a new one with the same name, attempt 1, boots from the disk the
// first one wrote.
func TestCRIRestartKeepsDisk(t *testing.T) {
	s := requireKVM(t, "bios", "pause")
	image := s.images["bios"].ref
	s.forEachFlavour(t, func(t *testing.T, c *containerd) {
		c.cleanupAfter(t)
		cl := c.cri(t)
		v := c.startPodContainer(t, cl, "vm-restart", "kvm", image)
		if err := waitLog(v.logPath, readyLine, bootTimeout); err != nil {
			t.Fatal(err)
		}
		overlay := filepath.Join(c.ShimStateDir, "pods", v.config.Metadata.Uid, "vm", "overlay.qcow2")
		before, err := os.Stat(overlay)
		if err != nil {
			t.Fatalf("the pod's disk: %v", err)
		}
		oldBase := backingFile(t, overlay)
		if err = cl.stopContainer(v); err != nil {
			t.Fatal(err)
		}
		if err = poll(stopTimeout, func() (bool, string) {
			_, statErr := os.Stat(oldBase)
			return errors.Is(statErr, fs.ErrNotExist), fmt.Sprintf("the exited container's image is still at %s", oldBase)
		}); err != nil {
			t.Fatal(err)
		}

		cfg := containerConfig("vm", image, nil)
		cfg.Metadata.Attempt = 1
		cfg.LogPath = "vm/1.log"
		cid, err := cl.createContainer(v.pod, cfg)
		if err != nil {
			t.Fatalf("CreateContainer, attempt 1: %v", err)
		}
		again := &podContainer{pod: v.pod, cid: cid, logPath: filepath.Join(v.logDir, cfg.LogPath)}
		ctx, cancel := criCtx()
		_, err = cl.Runtime.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: cid})
		cancel()
		if err != nil {
			t.Fatalf("StartContainer, attempt 1: %v", err)
		}
		if err = waitLog(again.logPath, readyLine, bootTimeout); err != nil {
			t.Fatal(err)
		}
		after, err := os.Stat(overlay)
		if err != nil || !os.SameFile(before, after) {
			t.Errorf("the restarted container did not keep the pod's disk %s: %v", overlay, err)
		}
		if base := backingFile(t, overlay); base == oldBase || !strings.HasPrefix(base, c.ShimStateDir+"/") {
			t.Errorf("the kept disk is backed by %s, want the restarted container's image (was %s)", base, oldBase)
		}

		if err := cl.stopContainer(again); err != nil {
			t.Error(err)
		}
		ctx, cancel = criCtx()
		defer cancel()
		if _, err := cl.Runtime.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: v.cid}); err != nil {
			t.Errorf("RemoveContainer %s: %v", v.cid, err)
		}
		cl.removePod(t, again)
		assertNothingLeft(t, c, append(v.shimIDs(), shimID{nsCRI, cid})...)
	})
}

// backingFile reads the backing file a qcow2 overlay records.
func backingFile(t *testing.T, overlay string) string {
	t.Helper()
	out, err := exec.Command("qemu-img", "info", "-U", "--output=json", overlay).Output()
	if err != nil {
		t.Fatalf("qemu-img info %s: %v", overlay, err)
	}
	var info struct {
		BackingFile string `json:"backing-filename"`
	}
	if err := json.Unmarshal(out, &info); err != nil || info.BackingFile == "" {
		t.Fatalf("qemu-img info %s: no backing file (%v): %s", overlay, err, out)
	}
	return info.BackingFile
}
