package vm

import (
	"os/exec"
	"testing"
	"time"
)

// fakeQEMU starts a process whose command line names domain name the way
// libvirt's QEMU command line does.
func fakeQEMU(t *testing.T, name string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", "sleep 60", "qemu-system-x86_64", "-name", "guest="+name+",debug-threads=on")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	// Until the child has exec'd, its command line is the test's.
	for deadline := time.Now().Add(5 * time.Second); !isQEMUOf(cmd.Process.Pid, name); {
		if time.Now().After(deadline) {
			t.Fatal("the fake QEMU's command line never named its domain")
		}
		time.Sleep(time.Millisecond)
	}
	return cmd
}

func exitedWithin(w *ExitWatch, d time.Duration) bool {
	select {
	case <-w.Exited():
		return true
	case <-time.After(d):
		return false
	}
}

// The watch reports the exit of the domain's QEMU, and only then.
func TestWatchExitSeesTheProcessEnd(t *testing.T) {
	cmd := fakeQEMU(t, "kvm-a")
	w, err := WatchExit("kvm-a", cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if exitedWithin(w, 200*time.Millisecond) {
		t.Fatal("exit reported while the process runs")
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	// Not reaped yet: a zombie has exited all the same.
	if !exitedWithin(w, 5*time.Second) {
		t.Fatal("no exit reported 5s after the process was killed")
	}
}

// A pid that is another domain's QEMU, or no process, counts as the
// exit: the QEMU the pid file named is gone and the pid was reused.
func TestWatchExitOfAnotherProcessIsAnExit(t *testing.T) {
	cmd := fakeQEMU(t, "kvm-b")
	for _, name := range []string{"kvm-c", "kvm-"} {
		w, err := WatchExit(name, cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		if !exitedWithin(w, time.Second) {
			t.Errorf("watch of %s on kvm-b's QEMU: no exit", name)
		}
		w.Close()
	}
	gone := exec.Command("/bin/true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	w, err := WatchExit("kvm-b", gone.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if !exitedWithin(w, time.Second) {
		t.Error("watch of a reaped pid: no exit")
	}
}

// Close ends the watch without an exit.
func TestWatchExitClose(t *testing.T) {
	cmd := fakeQEMU(t, "kvm-d")
	w, err := WatchExit("kvm-d", cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	w.Close() // twice is fine
	_ = cmd.Process.Kill()
	if exitedWithin(w, 300*time.Millisecond) {
		t.Error("a closed watch reported an exit")
	}
	select {
	case <-w.Closed():
	default:
		t.Error("Closed not closed")
	}
}

func TestIsQEMUOf(t *testing.T) {
	cmd := fakeQEMU(t, "kvm-e")
	pid := cmd.Process.Pid
	for name, want := range map[string]bool{"kvm-e": true, "kvm": false, "kvm-e,": false, "kvm-ee": false} {
		if got := isQEMUOf(pid, name); got != want {
			t.Errorf("isQEMUOf(%q) = %v, want %v", name, got, want)
		}
	}
}
