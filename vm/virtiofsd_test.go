package vm

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestVirtiofsdPidPrefix(t *testing.T) {
	for _, tc := range []struct {
		id   int32
		name string
		want string
	}{
		{7, "kvm-abc", "7-kvm-abc-"},
		{12, "kvm-kvm-it-vm-642f9ce59dd3", "12-kvm-kvm-it-vm-642f9c-"},
	} {
		if got := virtiofsdPidPrefix(tc.id, tc.name); got != tc.want {
			t.Errorf("virtiofsdPidPrefix(%d, %q) = %q, want %q", tc.id, tc.name, got, tc.want)
		}
	}
}

// fakeProc makes proc/<pid>/{exe,status} for each process.
func fakeProc(t *testing.T, procs map[int]struct {
	exe  string
	ppid int
}) string {
	t.Helper()
	proc := t.TempDir()
	for pid, p := range procs {
		d := filepath.Join(proc, fmt.Sprint(pid))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(p.exe, filepath.Join(d, "exe")); err != nil {
			t.Fatal(err)
		}
		status := fmt.Sprintf("Name:\tx\nPid:\t%d\nPPid:\t%d\n", pid, p.ppid)
		if err := os.WriteFile(filepath.Join(d, "status"), []byte(status), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return proc
}

func TestVirtiofsdPIDs(t *testing.T) {
	type p = struct {
		exe  string
		ppid int
	}
	proc := fakeProc(t, map[int]p{
		100: {"/usr/lib/qemu/virtiofsd", 1},
		101: {"/usr/lib/qemu/virtiofsd", 100}, // its sandbox
		200: {"/usr/lib/qemu/virtiofsd", 1},
		300: {"/usr/lib/qemu/virtiofsd", 1}, // another domain's
		301: {"/usr/lib/qemu/virtiofsd", 300},
		400: {"/usr/bin/sleep", 100}, // not a virtiofsd
		500: {"/usr/bin/qemu-system-x86_64", 1},
	})
	dir := t.TempDir()
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if d, got, err := virtiofsdPIDs(dir, "3-kvm-a-", proc); err != nil || got != nil || d != nil {
		t.Errorf("no shares: %v, %v, %v", d, got, err)
	}
	write("3-kvm-a-fs0-fs.pid", "100\n")
	write("3-kvm-a-fs1-fs.pid", "200")
	write("kvm-a.pid", "500")
	write("13-kvm-a-fs0-fs.pid", "300") // another domain's
	daemons, got, err := virtiofsdPIDs(dir, "3-kvm-a-", proc)
	slices.Sort(daemons)
	slices.Sort(got)
	if err != nil || !slices.Equal(daemons, []int{100, 200}) || !slices.Equal(got, []int{100, 101, 200}) {
		t.Errorf("got daemons %v, all %v, %v; want 100 200 and 100 101 200", daemons, got, err)
	}
	// A pid file that names another program, or holds no pid, is an error.
	write("3-kvm-a-fs2-fs.pid", "500")
	if _, _, err := virtiofsdPIDs(dir, "3-kvm-a-", proc); err == nil || !strings.Contains(err.Error(), "not a virtiofsd") {
		t.Errorf("pid of QEMU: %v", err)
	}
	write("3-kvm-a-fs2-fs.pid", "x")
	if _, _, err := virtiofsdPIDs(dir, "3-kvm-a-", proc); err == nil {
		t.Error("a pid file holding x was taken")
	}
}
