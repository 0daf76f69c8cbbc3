package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"libvirt.org/go/libvirtxml"
)

// A dead run's directory with a mount, a process naming it and a libvirt
// domain whose XML names it: the sweep removes all four, and leaves a
// directory without the prefix alone.
func TestSweepDeadRuns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts, and libvirt's qemu:///system")
	}
	if _, err := os.Stat("/var/run/libvirt/libvirt-sock"); err != nil {
		t.Skip("libvirtd is not running")
	}
	prefix := filepath.Join(os.TempDir(), fmt.Sprintf("kvm-sweep-test-%d-", os.Getpid()))
	dead := prefix + "run"
	other := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dead, "m"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = UnmountAll(dead); _ = os.RemoveAll(dead) })
	if err := syscall.Mount("tmpfs", filepath.Join(dead, "m"), "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	proc := exec.Command("/bin/sh", "-c", "sleep 60", "containerd", "--config", filepath.Join(dead, "config.toml"))
	if err := proc.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- proc.Wait() }()
	t.Cleanup(func() { _ = proc.Process.Kill() })
	// Until the child has exec'd, its arguments are this test's.
	for deadline := time.Now().Add(5 * time.Second); ; {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", proc.Process.Pid))
		if strings.Contains(string(b), dead) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the stand-in process never named the dead run's directory")
		}
		time.Sleep(time.Millisecond)
	}

	l, err := ConnectLibvirt()
	if err != nil {
		t.Fatal(err)
	}
	defer l.Disconnect()
	name := fmt.Sprintf("kvm-sweep-test-%d", os.Getpid())
	x, err := (&libvirtxml.Domain{
		Type: "qemu", Name: name, Memory: &libvirtxml.DomainMemory{Unit: "MiB", Value: 16},
		OS: &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Arch: "x86_64", Type: "hvm"}},
		Devices: &libvirtxml.DomainDeviceList{Serials: []libvirtxml.DomainSerial{{
			Source: &libvirtxml.DomainChardevSource{File: &libvirtxml.DomainChardevSourceFile{Path: dead + "/console.log"}},
		}}},
	}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	dom, err := l.DomainDefineXML(x)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.DomainUndefine(dom) })

	swept := SweepDeadRuns(prefix)
	t.Logf("swept: %q", swept)
	if _, err := l.DomainLookupByName(name); err == nil {
		t.Error("the dead run's domain is still defined")
	}
	select {
	case <-exited: //nolint:errcheck // the exit status of the run the sweep killed
	case <-time.After(5 * time.Second):
		t.Error("the dead run's process is still alive")
	}
	if m := MountsUnder(dead); len(m) > 0 {
		t.Errorf("mounts left: %v", m)
	}
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("the dead run's directory: %v, want it gone", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("a directory without the prefix: %v", err)
	}
	if len(swept) != 3 {
		t.Errorf("swept %d things, want 3 (domain, process, directory): %q", len(swept), swept)
	}
}
