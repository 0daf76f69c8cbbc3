package shim

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/procfs"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// vmDirOwnedBy makes a runtime dir under l whose owner file names this
// process, alive or (with a wrong start time) a dead shim.
func vmDirOwnedBy(t *testing.T, l layout, key string, alive bool) string {
	t.Helper()
	dir := l.vmDir(key)
	if err := os.MkdirAll(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "console.log"), []byte("guest output"), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := procfs.StartTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if !alive {
		st++
	}
	b, _ := json.Marshal(marker{Pid: os.Getpid(), StartTime: st})
	if err := os.WriteFile(filepath.Join(dir, ownerFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestSweepReleasesOnlyWhatBelongsToNoLiveVM(t *testing.T) {
	l := layout{root: t.TempDir()}
	fdDir := t.TempDir()
	f := newFakeDomains()
	dom := func(name, dir string, running bool) {
		f.doms[name] = &fakeDomain{meta: vm.Metadata{ContainerID: name, StateDir: dir}, running: running}
	}

	lost := vmDirOwnedBy(t, l, "lost", false) // power loss: stopped domain, shim gone
	dom("kvm-lost", lost, false)
	if err := os.WriteFile(filepath.Join(fdDir, "kvm-lost.sock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	running := vmDirOwnedBy(t, l, "running", false) // shim gone, VM runs on
	dom("kvm-running", running, true)
	exited := vmDirOwnedBy(t, l, "exited", true) // an exited container of a live shim
	dom("kvm-exited", exited, false)
	creating := vmDirOwnedBy(t, l, "creating", true) // a Create before its Define
	orphan := vmDirOwnedBy(t, l, "orphan", false)    // domain already undefined
	young := l.vmDir("young")                        // made before its owner file
	old := l.vmDir("old")                            // an older shim's, long gone
	for _, d := range []string{young, old} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	if err := os.Chtimes(old, now.Add(-2*sweepGrace), now.Add(-2*sweepGrace)); err != nil {
		t.Fatal(err)
	}
	dom("kvm-other-state-dir", filepath.Join(t.TempDir(), "vms", "x"), false)
	dom("kvm-no-dir", l.vmDir("vanished"), false)

	var released []string
	sweep(context.Background(), sweepScope{layout: l, conn: f, fdSocketDir: fdDir, release: func(owner string) error {
		released = append(released, owner)
		return nil
	}}, now)

	var left []string
	for name := range f.doms {
		left = append(left, name)
	}
	slices.Sort(left)
	if want := []string{"kvm-exited", "kvm-other-state-dir", "kvm-running"}; !slices.Equal(left, want) {
		t.Errorf("domains left: %v, want %v", left, want)
	}
	for dir, keep := range map[string]bool{lost: false, running: true, exited: true, creating: true, orphan: false, young: true, old: false} {
		_, err := os.Stat(dir)
		if kept := err == nil; kept != keep {
			t.Errorf("%s: kept=%v, want %v (stat: %v)", filepath.Base(dir), kept, keep, err)
		}
	}
	slices.Sort(released)
	if want := []string{"kvm-lost/kvm-lost", "kvm-no-dir/kvm-no-dir"}; !slices.Equal(released, want) {
		t.Errorf("NUMA reservations released: %v, want %v", released, want)
	}
	if _, err := os.Stat(filepath.Join(fdDir, "kvm-lost.sock")); !os.IsNotExist(err) {
		t.Errorf("descriptor socket of the swept domain: %v, want it removed", err)
	}
}

// Removing a VM dir never reaches through a mount it did not make itself:
// a volume mounted anywhere below it keeps the dir and the volume's data.
func TestRemoveVMDirStopsAtAMount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to bind mount")
	}
	dir := filepath.Join(t.TempDir(), "vm")
	volume := t.TempDir()
	data := filepath.Join(volume, "data")
	if err := os.WriteFile(data, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(dir, "elsewhere", "mnt")
	if err := os.MkdirAll(target, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(volume, target, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(target, unix.MNT_DETACH) })

	err := removeVMDir(dir)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), target) {
		t.Errorf("removeVMDir with %s mounted: %v, want FailedPrecondition naming it", target, err)
	}
	if b, err := os.ReadFile(data); err != nil || string(b) != "keep" {
		t.Fatalf("the mounted volume's data: %q, %v", b, err)
	}
	if err := unix.Unmount(target, 0); err != nil {
		t.Fatal(err)
	}
	if err := removeVMDir(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("dir left after the mount went: %v", err)
	}
}

// A Create that defines a lost VM's domain name anew while the sweep runs
// (the pod re-created after a power loss, in another shim) keeps its
// definition and descriptor socket: the sweep reads the domain's metadata
// again before it undefines, and leaves a name that now names another
// runtime dir; the lost VM's NUMA reservation still goes.
func TestSweepSparesANameDefinedAnew(t *testing.T) {
	l := layout{root: t.TempDir()}
	f := newFakeDomains()
	lost := vmDirOwnedBy(t, l, "lost", false)
	f.doms["kvm-pod"] = &fakeDomain{meta: vm.Metadata{ContainerID: "old", StateDir: lost}}
	fresh := vmDirOwnedBy(t, l, "fresh", true)
	fdDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(fdDir, "kvm-pod.sock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	f.stateRead = func(name string) {
		// The Create's Define, after the sweep's listing and state read.
		f.mu.Lock()
		f.doms[name] = &fakeDomain{meta: vm.Metadata{ContainerID: "new", StateDir: fresh}}
		f.mu.Unlock()
	}
	var released []string
	sweep(context.Background(), sweepScope{layout: l, conn: f, fdSocketDir: fdDir, release: func(owner string) error {
		released = append(released, owner)
		return nil
	}}, time.Now())

	if d, ok := f.doms["kvm-pod"]; !ok || d.meta.ContainerID != "new" {
		t.Errorf("the new definition of kvm-pod was undefined (calls %v)", f.called())
	}
	if want := []string{"kvm-pod/old"}; !slices.Equal(released, want) {
		t.Errorf("NUMA reservations released: %v, want the lost VM's only, %v", released, want)
	}
	if _, err := os.Stat(filepath.Join(fdDir, "kvm-pod.sock")); err != nil {
		t.Errorf("the new VM's descriptor socket: %v, want it kept", err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("the new VM's runtime dir: %v", err)
	}
	if _, err := os.Stat(lost); !os.IsNotExist(err) {
		t.Errorf("the lost VM's runtime dir: %v, want it removed", err)
	}
}
