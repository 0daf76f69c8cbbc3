package shim

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/kvm-shim/containerd-shim-kvm-v1/hostid"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

const testIDRange = "1000000000-1000000009"

func ownerOf(t *testing.T, p string) (uint32, os.FileMode) {
	t.Helper()
	st, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return st.Sys().(*syscall.Stat_t).Uid, st.Mode().Perm()
}

// A VM runs under an identity of its own, named in its domain, and its
// files are that identity's alone; delete frees the identity.
func TestVMIdentity(t *testing.T) {
	f := newVMFixture(t)
	f.kernelRootfs()
	vt, err := f.create(map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	id := vt.rec.Identity
	if id == nil || id.UID != 1000000000 || id.GID != id.UID {
		t.Fatalf("identity %+v, want the range's first id as uid and gid", id)
	}
	x := f.fake.doms[vt.rec.Domain].xml
	if got, err := vm.IdentityFromXML(x); err != nil || got == nil || *got != *id {
		t.Fatalf("domain's DAC label = %v, %v; want %v", got, err, *id)
	}
	if uid, mode := ownerOf(t, vt.rec.VMDir); uid != id.UID || mode != 0o700 {
		t.Errorf("VM dir: owner %d mode %#o, want %d 0700", uid, mode, id.UID)
	}
	drive := filepath.Join(vt.rec.VMDir, "config-2.img")
	if uid, mode := ownerOf(t, drive); uid != id.UID || mode != 0o600 {
		t.Errorf("config drive: owner %d mode %#o, want %d 0600", uid, mode, id.UID)
	}
	snap, _ := f.host.ids.Snapshot()
	if snap[vmOwner(vt.rec.Domain, "vm1")] != id.UID {
		t.Fatalf("store %v lacks the VM's id", snap)
	}
	if err := vt.delete(context.Background()); err != nil {
		t.Fatal(err)
	}
	if snap, _ := f.host.ids.Snapshot(); len(snap) != 0 {
		t.Fatalf("after delete the store still holds %v", snap)
	}
}

// A failed create gives its identity back.
func TestVMIdentityRolledBack(t *testing.T) {
	f := newVMFixture(t)
	// No boot source in the rootfs: the create fails after allocating.
	if _, err := f.create(map[string]string{}); err == nil {
		t.Fatal("create without a boot source succeeded")
	}
	if snap, _ := f.host.ids.Snapshot(); len(snap) != 0 {
		t.Fatalf("a failed create left %v allocated", snap)
	}
}

// A new shim frees what a crashed one allocated for a VM it never
// defined, and keeps what a domain's label names.
func TestReconcileIDs(t *testing.T) {
	dir := t.TempDir()
	r, _ := hostid.ParseRange(testIDRange)
	store, err := hostid.OpenStore(filepath.Join(dir, "ids.json"), r)
	if err != nil {
		t.Fatal(err)
	}
	fake := newFakeDomains()
	s := goldenSpecWithIdentity(1000000004)
	xml, err := vm.Render(&s)
	if err != nil {
		t.Fatal(err)
	}
	if err := fake.Define(xml); err != nil {
		t.Fatal(err)
	}
	if err := reconcileIDs(context.Background(), store, fake); err != nil {
		t.Fatal(err)
	}
	snap, _ := store.Snapshot()
	if len(snap) != 1 || snap[vmOwner(s.Name, s.Meta.ContainerID)] != 1000000004 {
		t.Fatalf("after reconcile: %v, want the domain's id", snap)
	}
	// The next allocation never hands out the live domain's id.
	for i := range 9 {
		id, err := store.Allocate("other" + string(rune('a'+i)))
		if err != nil || id == 1000000004 {
			t.Fatalf("allocation %d = %d, %v", i, id, err)
		}
	}
}

func goldenSpecWithIdentity(uid uint32) vm.Spec {
	return vm.Spec{
		Name: "kvm-default-vm9-0123456789ab", UUID: "01234567-89ab-cdef-0123-456789abcdef",
		VCPUs: 1, MemoryMiB: 128, Accel: vm.AccelTCG, Emulator: "/usr/bin/qemu-system-x86_64", Machine: "q35",
		Kernel:   &vm.Kernel{Path: "/k"},
		Console:  vm.Console{Socket: "/s", Log: "/l"},
		Meta:     vm.Metadata{ContainerID: "vm9", Namespace: "default", StateDir: "/x"},
		Identity: &vm.Identity{UID: uid, GID: uid},
	}
}

// A read-only disk.img must be readable by the VM's identity alone:
// libvirt cannot give it to the VM through a read-only mount.
func TestReadableBy(t *testing.T) {
	id := vm.Identity{UID: 1000000001, GID: 1000000001}
	p := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		uid, gid int
		mode     os.FileMode
		want     bool
	}{
		{0, 0, 0o600, false},
		{0, 0, 0o644, true},
		{0, 4242, 0o640, false}, // the pod's fsGroup: QEMU has no such group
		{1000000001, 0, 0o600, true},
		{1000000001, 0, 0o044, false}, // the owner class decides, as the kernel does
		{0, 1000000001, 0o640, true},
	} {
		if err := os.Chown(p, tc.uid, tc.gid); err != nil {
			t.Skipf("chown needs root: %v", err)
		}
		if err := os.Chmod(p, tc.mode); err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := readableBy(st, id); got != tc.want {
			t.Errorf("owner %d:%d mode %#o: readable by %d = %v, want %v", tc.uid, tc.gid, tc.mode, id.UID, got, tc.want)
		}
	}
}

// What outlives a VM goes back to root, unless the pod's next VM (another
// identity) owns it by now.
func TestTakeBack(t *testing.T) {
	dir := t.TempDir()
	mine, theirs := filepath.Join(dir, "overlay.qcow2"), filepath.Join(dir, "next")
	for p, uid := range map[string]int{mine: 1000000001, theirs: 1000000002} {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, uid, uid); err != nil {
			t.Skipf("chown needs root: %v", err)
		}
	}
	if err := takeBack(&vm.Identity{UID: 1000000001, GID: 1000000001}, mine, theirs, filepath.Join(dir, "gone")); err != nil {
		t.Fatal(err)
	}
	if uid, _ := ownerOf(t, mine); uid != 0 {
		t.Errorf("the VM's own file is still owned by %d", uid)
	}
	if uid, _ := ownerOf(t, theirs); uid != 1000000002 {
		t.Errorf("the next VM's file was taken: owner %d", uid)
	}
}

// The sweep of a lost VM gives its identity back with its placement.
func TestReleaseHeld(t *testing.T) {
	f := newVMFixture(t)
	owner := vmOwner("kvm-lost", "c1")
	if _, err := f.host.ids.Allocate(owner); err != nil {
		t.Fatal(err)
	}
	if err := f.host.releaseHeld(owner); err != nil {
		t.Fatal(err)
	}
	if snap, _ := f.host.ids.Snapshot(); len(snap) != 0 {
		t.Fatalf("after releaseHeld the store holds %v", snap)
	}
}
