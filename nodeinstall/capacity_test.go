package nodeinstall

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/kvm-shim/containerd-shim-kvm-v1/numa"
)

// TestInstallAdvertisesCapacity: the node's VM capacity is in its status
// (capacity and allocatable) before the label, follows a changed figure
// on the next run, stays while check fails (VM pods hold it), and leaves
// with the uninstall only after the VM pods.
func TestInstallAdvertisesCapacity(t *testing.T) {
	r := newRig(t, "containerd://2.2.1")
	res, err := r.in.Install(context.Background())
	if err != nil || res.VCPUCapacity != 8 {
		t.Fatalf("install: %+v, %v; want capacity 8", res, err)
	}
	if v, same := r.api.resource(numa.VCPUResource); v != "8" || !same {
		t.Fatalf("%s = %q (allocatable the same: %v), want 8", numa.VCPUResource, v, same)
	}
	if !slices.Equal(r.api.calls, []string{"status", "label"}) {
		t.Fatalf("API patches %q, want the status before the label", r.api.calls)
	}
	r.capacity.n = 2 // cpu_threshold lowered
	if _, err := r.in.Install(context.Background()); err != nil {
		t.Fatal(err)
	}
	if v, _ := r.api.resource(numa.VCPUResource); v != "2" {
		t.Fatalf("%s = %q after the capacity changed, want 2", numa.VCPUResource, v)
	}
	r.check.fail = []string{"libvirt"}
	if _, err := r.in.Install(context.Background()); err == nil {
		t.Fatal("install with check failing succeeded")
	}
	if v, _ := r.api.resource(numa.VCPUResource); v != "2" {
		t.Fatalf("%s = %q with check failing, want it kept for the VM pods running", numa.VCPUResource, v)
	}
	r.check.fail = nil
	if _, err := r.in.Uninstall(context.Background(), UninstallOptions{}); err != nil {
		t.Fatal(err)
	}
	if v, ok := r.api.resource(numa.VCPUResource); v != "" || ok {
		t.Fatalf("%s = %q after uninstall, want it gone", numa.VCPUResource, v)
	}
}

// TestInstallCapacityUnreadable: no figure, no label, an event.
func TestInstallCapacityUnreadable(t *testing.T) {
	r := newRig(t, "containerd://2.2.1")
	r.capacity.err = errors.New("shim config: bad cpu_threshold")
	_, err := r.in.Install(context.Background())
	if err == nil || !strings.Contains(err.Error(), "cpu_threshold") {
		t.Fatalf("install: %v, want the capacity's error", err)
	}
	if v, ok := r.api.label(); ok {
		t.Fatalf("node labelled %q without its capacity", v)
	}
	if len(r.api.events) != 1 || !strings.Contains(r.api.events[0].Message, "cpu_threshold") {
		t.Fatalf("events %+v, want one naming the problem", r.api.events)
	}
}

// TestHostCapacity reads a node's topology and the shim's config as the
// shim does: 2 CPUs × cpu_threshold.
func TestHostCapacity(t *testing.T) {
	root := t.TempDir()
	for rel, content := range map[string]string{
		"sys/devices/system/cpu/online":            "0-1\n",
		"sys/devices/system/node/online":           "0\n",
		"sys/devices/system/node/node0/cpulist":    "0-1\n",
		"sys/devices/system/node/node0/meminfo":    "Node 0 MemTotal:       25165824 kB\n",
		"sys/devices/system/node/node0/distance":   "10\n",
		"etc/containerd-shim-kvm-v1/config.toml":   "cpu_threshold = 1.5\n",
		"etc/containerd-shim-kvm-v1/bad.toml":      "cpu_threshold = -1.0\n",
		"etc/containerd-shim-kvm-v1/default.toml":  "",
		"etc/containerd-shim-kvm-v1/reserved.toml": "reserved_cpus = \"1\"\n",
	} {
		p := filepath.Join(root, rel)
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		must(t, os.WriteFile(p, []byte(content), 0o644))
	}
	for cfg, want := range map[string]int64{"config.toml": 3, "default.toml": 8, "reserved.toml": 4} {
		h := HostCapacity{SysRoot: root, ShimConfig: filepath.Join(root, "etc/containerd-shim-kvm-v1", cfg)}
		if got, err := h.VCPUCapacity(context.Background()); err != nil || got != want {
			t.Errorf("%s: VCPUCapacity = %d, %v; want %d", cfg, got, err, want)
		}
	}
	h := HostCapacity{SysRoot: root, ShimConfig: filepath.Join(root, "etc/containerd-shim-kvm-v1/bad.toml")}
	if _, err := h.VCPUCapacity(context.Background()); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("bad config: %v, want InvalidArgument", err)
	}
}
