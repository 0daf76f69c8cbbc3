//go:build demo

// Package demo drives `make demo` the way a person does: in a real terminal
// (tmux, from Debian), reading the screen with capture-pane and typing into
// the guest's console with send-keys.
//
// The tests carry the build tag demo (`make demo-test`, run by `make test`).
// They run the real `make demo`: as root, with Debian's containerd, libvirtd
// and the guest images; the demo installs the shim to /usr/local.
package demo

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

const (
	// demoDir is hack/demo.sh's default: the test runs the demo as a person
	// would, with no environment of its own.
	demoDir  = "/run/kvm-shim-demo"
	demoSock = demoDir + "/containerd.sock"
	// tmuxSocket is a tmux server of the test's own (-L), so a person's
	// tmux sessions on the host are not touched.
	tmuxSocket = "kvm-demo-test"
	prompt     = "kvm-guest:/# "
	// bootTimeout covers `make demo`'s setup, install and image steps and a
	// TCG boot on a loaded two-core host.
	bootTimeout = 5 * time.Minute
)

var repo = func() string {
	r, err := filepath.Abs("../..")
	if err != nil {
		panic(err)
	}
	return r
}()

// terminal is one tmux session running `make demo`.
type terminal struct {
	t        *testing.T
	name     string
	exitFile string // the exit status of make demo, once it ended
}

func tmux(args ...string) ([]byte, error) {
	return exec.Command("tmux", append([]string{"-L", tmuxSocket}, args...)...).CombinedOutput()
}

// startDemo opens a 200x50 terminal that runs `make demo` in the repo.
func startDemo(t *testing.T, name string) *terminal {
	t.Helper()
	exitFile := filepath.Join(t.TempDir(), "exit")
	// The shell line is the test's own (repo and temp paths, no input):
	// make demo, then its exit status into a file; the pane stays open
	// (remain-on-exit) so the screen can still be read.
	script := fmt.Sprintf("make -C %q demo; echo $? >%q", repo, exitFile)
	if out, err := tmux("new-session", "-d", "-s", name, "-x", "200", "-y", "50", "bash", "-c", script); err != nil {
		t.Fatalf("tmux new-session: %v: %s", err, out)
	}
	if out, err := tmux("set-option", "-t", name, "remain-on-exit", "on"); err != nil {
		t.Logf("tmux set-option remain-on-exit: %v: %s", err, out)
	}
	if out, err := tmux("set-option", "-t", name, "history-limit", "20000"); err != nil {
		t.Logf("tmux set-option history-limit: %v: %s", err, out)
	}
	tm := &terminal{t: t, name: name, exitFile: exitFile}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("screen of %s:\n%s", name, tm.screen())
		}
		_, _ = tmux("kill-session", "-t", name)
	})
	return tm
}

// screen is the terminal's whole scrollback and screen, wrapped lines joined.
func (tm *terminal) screen() string {
	out, err := tmux("capture-pane", "-p", "-J", "-S", "-", "-t", tm.name)
	if err != nil {
		return fmt.Sprintf("(capture-pane: %v: %s)", err, out)
	}
	return string(out)
}

// waitFor waits until re matches the screen n times or more.
func (tm *terminal) waitFor(re *regexp.Regexp, n int, timeout time.Duration) {
	tm.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		s := tm.screen()
		if len(re.FindAllStringIndex(s, -1)) >= n {
			return
		}
		if code, ended := tm.exited(); ended {
			tm.t.Fatalf("make demo ended (status %s) before the screen showed %q %d times", code, re, n)
		}
		if time.Now().After(deadline) {
			tm.t.Fatalf("the screen did not show %q %d times within %v", re, n, timeout)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// typeLine types text and Enter, as a person does.
func (tm *terminal) typeLine(text string) {
	tm.t.Helper()
	if out, err := tmux("send-keys", "-t", tm.name, "-l", text); err != nil {
		tm.t.Fatalf("tmux send-keys %q: %v: %s", text, err, out)
	}
	tm.keys("Enter")
}

// keys sends tmux key names (Enter, C-c).
func (tm *terminal) keys(names ...string) {
	tm.t.Helper()
	if out, err := tmux(append([]string{"send-keys", "-t", tm.name}, names...)...); err != nil {
		tm.t.Fatalf("tmux send-keys %v: %v: %s", names, err, out)
	}
}

// exited reports make demo's exit status once it ended.
func (tm *terminal) exited() (string, bool) {
	b, err := os.ReadFile(tm.exitFile)
	if err != nil || !bytes.HasSuffix(b, []byte("\n")) {
		return "", false
	}
	return strings.TrimSpace(string(b)), true
}

// waitExit waits for make demo to end and returns its status.
func (tm *terminal) waitExit(timeout time.Duration) string {
	tm.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if code, ok := tm.exited(); ok {
			return code
		}
		if time.Now().After(deadline) {
			tm.t.Fatalf("make demo did not end within %v", timeout)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

var (
	reReady    = regexp.MustCompile(`KVM-GUEST-READY`)
	rePrompt   = regexp.MustCompile(regexp.QuoteMeta(prompt))
	reHint     = regexp.MustCompile(`Type 'poweroff' in the guest to end the demo\.`)
	rePowerOff = regexp.MustCompile(`KVM-GUEST-POWEROFF`)
)

// waitBooted waits for the demo's hint, the guest's READY and a shell prompt.
func (tm *terminal) waitBooted(nth int) {
	tm.t.Helper()
	tm.waitFor(reHint, 1, bootTimeout)
	tm.waitFor(reReady, nth, 2*time.Minute)
	tm.waitFor(rePrompt, nth, time.Minute)
}

// demoLeftovers lists what of a demo is still on the host: its containerd,
// a kvm shim serving it, its VM's domain, mounts below its dir.
func demoLeftovers() []string {
	var left []string
	for _, p := range testenv.ProcessesMatching(func(args []string) bool {
		return filepath.Base(args[0]) == "containerd" && contains(args, demoDir+"/config.toml")
	}) {
		left = append(left, fmt.Sprintf("containerd pid %d: %s", p.Pid, p.Cmdline))
	}
	for _, p := range testenv.ProcessesMatching(func(args []string) bool {
		return strings.HasPrefix(filepath.Base(args[0]), "containerd-shim-") && contains(args, demoSock)
	}) {
		left = append(left, fmt.Sprintf("shim pid %d: %s", p.Pid, p.Cmdline))
	}
	for _, p := range testenv.ProcessesMatching(func(args []string) bool {
		return filepath.Base(args[0]) == "ctr" && contains(args, demoSock)
	}) {
		left = append(left, fmt.Sprintf("ctr pid %d: %s", p.Pid, p.Cmdline))
	}
	for _, d := range demoDomains() {
		left = append(left, "domain "+d)
	}
	for _, m := range testenv.MountsUnder(demoDir) {
		left = append(left, "mount "+m)
	}
	return left
}

// demoDomains lists the libvirt domains of the demo's container (ctr's
// namespace default, container demo: shim/naming.go's DomainName).
func demoDomains() []string {
	l, err := testenv.ConnectLibvirt()
	if err != nil {
		return []string{err.Error()}
	}
	defer l.Disconnect()
	doms, _, err := l.ConnectListAllDomains(1, 0)
	if err != nil {
		return []string{err.Error()}
	}
	var own []string
	for _, d := range doms {
		if strings.HasPrefix(d.Name, "kvm-default-demo-") {
			own = append(own, d.Name)
		}
	}
	return own
}

func contains(args []string, s string) bool {
	for _, a := range args {
		if a == s {
			return true
		}
	}
	return false
}

// waitNothingLeft waits until no piece of a demo is left on the host.
func waitNothingLeft(t *testing.T, what string, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := testenv.Poll(ctx, 250*time.Millisecond, func() (bool, string) {
		left := demoLeftovers()
		return len(left) == 0, strings.Join(left, "; ")
	}); err != nil {
		t.Fatalf("%s: the demo left: %v", what, err)
	}
}

// taskPid is the demo task's pid (the VM's QEMU), from ctr.
func taskPid(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("ctr", "-a", demoSock, "tasks", "ls").CombinedOutput()
	if err != nil {
		t.Fatalf("ctr tasks ls: %v: %s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == "demo" {
			return f[1]
		}
	}
	t.Fatalf("no task demo in:\n%s", out)
	return ""
}

func requireHost(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the demo test runs make demo, which needs root")
	}
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatal("tmux is not installed (hack/setup-host.sh installs it)")
	}
	t.Cleanup(func() { _, _ = tmux("kill-server") })
	if left := demoLeftovers(); len(left) > 0 {
		t.Logf("an earlier demo left (make demo must clear it): %s", strings.Join(left, "; "))
	}
}

// TestDemoInATerminal is the demo as the README tells it: the console shows
// the boot and a shell; a command typed there answers; Ctrl-C reaches the
// guest, not the demo; `reboot` restarts the guest in the same QEMU;
// `poweroff` ends the demo with status 0 and leaves nothing running.
func TestDemoInATerminal(t *testing.T) {
	requireHost(t)
	start := time.Now()
	tm := startDemo(t, "demo-poweroff")
	tm.waitBooted(1)
	t.Logf("booted to the guest's shell %.1f s after make demo", time.Since(start).Seconds())

	// The guest computes the answer, so the screen shows more than the
	// echo of what was typed.
	tm.typeLine(`echo "answer=$((6 * 7))"`)
	tm.waitFor(regexp.MustCompile(`(?m)^answer=42`), 1, 30*time.Second)

	tm.typeLine("sleep 600")
	time.Sleep(time.Second)
	tm.keys("C-c")
	tm.waitFor(rePrompt, 3, 30*time.Second)
	tm.typeLine(`echo "still=$((7 * 8))"`)
	tm.waitFor(regexp.MustCompile(`(?m)^still=56`), 1, 30*time.Second)

	pid := taskPid(t)
	tm.typeLine("reboot")
	tm.waitFor(regexp.MustCompile(`KVM-GUEST-REBOOT`), 1, 30*time.Second)
	tm.waitFor(reReady, 2, 2*time.Minute)
	tm.waitFor(rePrompt, 5, time.Minute)
	if after := taskPid(t); after != pid {
		t.Fatalf("after reboot the task's QEMU is pid %s, before it was %s: the guest must reboot in the same QEMU", after, pid)
	}

	rebooted := time.Now()
	tm.typeLine("poweroff")
	if code := tm.waitExit(2 * time.Minute); code != "0" {
		t.Fatalf("make demo exited with status %s after poweroff in the guest, want 0", code)
	}
	t.Logf("poweroff typed to make demo's exit: %.1f s", time.Since(rebooted).Seconds())
	if !rePowerOff.MatchString(tm.screen()) {
		t.Fatal("the screen does not show the guest's KVM-GUEST-POWEROFF")
	}
	waitNothingLeft(t, "after poweroff", 30*time.Second)
}

// TestDemoInterrupted: a demo whose terminal is closed, and one that is
// killed with SIGTERM, each leave nothing running; a demo killed with
// SIGKILL (which nothing can clean after) is followed by a demo that says
// what it removed and works.
func TestDemoInterrupted(t *testing.T) {
	requireHost(t)

	t.Run("ClosedTerminal", func(t *testing.T) {
		tm := startDemo(t, "demo-closed")
		tm.waitBooted(1)
		if out, err := tmux("kill-session", "-t", tm.name); err != nil {
			t.Fatalf("tmux kill-session: %v: %s", err, out)
		}
		waitNothingLeft(t, "after its terminal was closed", time.Minute)
		logText, _ := os.ReadFile(filepath.Join(demoDir, "demo.log"))
		if !strings.Contains(string(logText), "ending the demo: removing the task 'demo'") {
			t.Fatalf("demo.log does not show the task removed at the hangup:\n%s", logText)
		}
	})

	t.Run("SIGTERM", func(t *testing.T) {
		tm := startDemo(t, "demo-term")
		tm.waitBooted(1)
		pids := demoScripts()
		if len(pids) != 1 {
			t.Fatalf("want one hack/demo.sh process, found %v", pids)
		}
		if err := kill(pids[0], "TERM"); err != nil {
			t.Fatal(err)
		}
		if code := tm.waitExit(time.Minute); code == "0" {
			t.Fatalf("make demo exited 0 after SIGTERM; want the failure")
		}
		waitNothingLeft(t, "after kill -TERM of the demo", time.Minute)
	})

	t.Run("SIGKILLThenAgain", func(t *testing.T) {
		tm := startDemo(t, "demo-killed")
		tm.waitBooted(1)
		for _, pid := range demoScripts() {
			if err := kill(pid, "KILL"); err != nil {
				t.Fatal(err)
			}
		}
		_, _ = tmux("kill-session", "-t", tm.name)
		if left := demoLeftovers(); len(left) == 0 {
			t.Fatal("a demo killed with SIGKILL left nothing: the case tests nothing")
		}

		again := startDemo(t, "demo-again")
		again.waitBooted(1)
		s := again.screen()
		for _, want := range []string{
			"an earlier demo left this: found the containerd of an earlier demo",
			"an earlier demo left this: removing the task 'demo' and its VM",
		} {
			if !strings.Contains(s, want) {
				t.Errorf("the next demo does not say %q", want)
			}
		}
		again.typeLine("poweroff")
		if code := again.waitExit(2 * time.Minute); code != "0" {
			t.Fatalf("the next demo exited with status %s after poweroff, want 0", code)
		}
		waitNothingLeft(t, "after the next demo's poweroff", 30*time.Second)
	})
}

// demoScripts lists the pids of running hack/demo.sh scripts.
func demoScripts() []int {
	var pids []int
	for _, p := range testenv.ProcessesMatching(func(args []string) bool {
		return len(args) >= 2 && filepath.Base(args[0]) == "bash" && strings.HasSuffix(args[1], "hack/demo.sh")
	}) {
		pids = append(pids, p.Pid)
	}
	return pids
}

func kill(pid int, sig string) error {
	if out, err := exec.Command("kill", "-"+sig, fmt.Sprint(pid)).CombinedOutput(); err != nil {
		return fmt.Errorf("kill -%s %d: %v: %s", sig, pid, err, out)
	}
	return nil
}
