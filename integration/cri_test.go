//go:build integration

package integration

import (
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
