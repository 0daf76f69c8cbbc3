//go:build integration

package integration

import (
	"context"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// The shim's message when the guest has no agent (vm.ErrNoAgent) and for
// an exec with a TTY (shim/exec.go).
const (
	noAgentMessage = "no QEMU guest agent is answering in the VM; install qemu-guest-agent"
	ttyHint        = "kubectl attach -it"
)

// execCtr runs `ctr task exec` in container id with stdin (may be empty).
func (c *containerd) execCtr(ns, id, execID, stdin string, args ...string) testenv.Result {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := c.CtrCmd(ctx, ns, append([]string{"task", "exec", "--exec-id", execID, id}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	r := testenv.Result{Args: cmd.Args[1:], Stdout: out.String(), Stderr: errOut.String(), Code: -1, Err: err}
	if cmd.ProcessState != nil {
		r.Code = cmd.ProcessState.ExitCode()
	}
	return r
}

// execCtrTTY runs `ctr task exec -t` with a pseudo-terminal as its stdin
// and stdout (ctr insists on one); stderr is kept apart.
func (c *containerd) execCtrTTY(t *testing.T, ns, id, execID string, args ...string) testenv.Result {
	t.Helper()
	master, slave := openPty(t)
	defer master.Close()
	defer slave.Close()
	go func() { _, _ = io.Copy(io.Discard, master) }()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := c.CtrCmd(ctx, ns, append([]string{"task", "exec", "-t", "--exec-id", execID, id}, args...)...)
	var errOut strings.Builder
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, &errOut
	err := cmd.Run()
	r := testenv.Result{Args: cmd.Args[1:], Stderr: errOut.String(), Code: -1, Err: err}
	if cmd.ProcessState != nil {
		r.Code = cmd.ProcessState.ExitCode()
	}
	return r
}

// openPty opens a new pseudo-terminal pair from /dev/ptmx.
func openPty(t *testing.T) (master, slave *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fd := int(master.Fd())
	if err = unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlock pty: %v", err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("pty number: %v", err)
	}
	slave, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	return master, slave
}

// waitAgentCtr runs `true` in the guest until the agent answers.
func (c *containerd) waitAgentCtr(t *testing.T, ns, id string, timeout time.Duration) {
	t.Helper()
	n := 0
	start := time.Now()
	if err := poll(timeout, func() (bool, string) {
		n++
		r := c.execCtr(ns, id, fmt.Sprintf("wait-agent-%d", n), "", "true")
		return r.Code == 0, fmt.Sprintf("exit %d: %s", r.Code, r.Stderr)
	}); err != nil {
		t.Fatalf("the guest agent never answered: %v", err)
	}
	t.Logf("guest agent answered %v after the VM ran", time.Since(start).Round(100*time.Millisecond))
}

// TestCtrExec: ctr task exec runs commands in the guest through the QEMU
// guest agent: output, exit codes, stdin, a missing command; a TTY and a
// paused VM are refused with a message; attach's stdin reaches the
// console.
func TestCtrExec(t *testing.T) {
	s := requireKVM(t, "kernel")
	s.forEachFlavour(t, func(t *testing.T, c *containerd) {
		c.cleanupAfter(t)
		id := "it-exec"
		c.runDetached(t, id, "kernel")
		c.waitAgentCtr(t, nsDefault, id, bootTimeout)

		r := c.execCtr(nsDefault, id, "out", "", "sh", "-c", "echo out; echo err >&2; exit 3")
		if r.Code != 3 || r.Stdout != "out\n" || !strings.Contains(r.Stderr, "err") {
			t.Errorf("exec with output: %v", r)
		}
		r = c.execCtr(nsDefault, id, "stdin", "hello through stdin\nline 2\n", "cat")
		if r.Code != 0 || r.Stdout != "hello through stdin\nline 2\n" {
			t.Errorf("exec with stdin: %v", r)
		}
		r = c.execCtr(nsDefault, id, "args", "", "printf", "[%s]", "a b", "$HOME", ";ls")
		if r.Code != 0 || r.Stdout != "[a b][$HOME][;ls]" {
			t.Errorf("argv is passed as is, no shell: %v", r)
		}
		r = c.execCtr(nsDefault, id, "missing", "", "no-such-command", "x")
		if r.Code != 127 || !strings.Contains(r.Stderr, "not found") {
			t.Errorf("missing command: %v; want exit 127 and 'not found'", r)
		}
		r = c.execCtrTTY(t, nsDefault, id, "tty", "sh")
		if r.Err == nil || !strings.Contains(r.Stderr, ttyHint) {
			t.Errorf("exec with a TTY: %v; want a refusal naming %q", r, ttyHint)
		}
		c.mustCtr(t, nsDefault, "task", "pause", id)
		r = c.execCtr(nsDefault, id, "paused", "", "true")
		if r.Err == nil || !strings.Contains(r.Stderr, "paused") {
			t.Errorf("exec in a paused VM: %v; want a refusal saying it is paused", r)
		}
		c.mustCtr(t, nsDefault, "task", "resume", id)
		if r := c.execCtr(nsDefault, id, "resumed", "", "true"); r.Code != 0 {
			t.Errorf("exec after resume: %v", r)
		}
		// No exec is left in the task: ctr task ps lists QEMU alone.
		if pids := c.taskPids(t, nsDefault, id); len(pids) != 1 {
			t.Errorf("ctr task ps after the execs: %v", pids)
		}
		c.killAndDelete(t, id)
		assertNothingLeft(t, c, shimID{nsDefault, id})
	})
}

// TestCtrAttachStdin: the task's stdin reaches the guest's serial console
// (what `kubectl attach -it` and `ctr task attach` use, since an exec has
// no TTY).
func TestCtrAttachStdin(t *testing.T) {
	s := requireKVM(t, "kernel")
	s.forEachFlavour(t, func(t *testing.T, c *containerd) {
		id := "it-attach"
		f := c.foregroundVM(t, id, "KVM-GUEST-AGENT /dev/") // the shell comes after
		deadline := time.Now().Add(time.Minute)
		for !strings.Contains(f.out.String(), "ATTACH-42") && time.Now().Before(deadline) {
			if _, err := f.stdin.Write([]byte("echo ATTACH-$((6*7))\n")); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * time.Second)
		}
		f.waitOutput(t, "ATTACH-42", time.Second)
		c.killForeground(t, f, id)
	})
}

// foregroundVM runs the kernel image with ctr run in the foreground (its
// stdin and stdout are the console) and waits for line on the console.
func (c *containerd) foregroundVM(t *testing.T, id, line string, runArgs ...string) *foreground {
	t.Helper()
	c.cleanupAfter(t)
	f := c.runForeground(t, nsDefault, c.kvmRun(append(runArgs, c.suite.images["kernel"].ref, id)...)...)
	f.waitOutput(t, line, bootTimeout)
	return f
}

// killForeground destroys a foreground VM and checks nothing is left.
func (c *containerd) killForeground(t *testing.T, f *foreground, id string) {
	t.Helper()
	c.mustCtr(t, nsDefault, "task", "kill", "-s", "KILL", id)
	if code := f.wait(t, stopTimeout); code != 137 {
		t.Errorf("ctr run exited %d after SIGKILL", code)
	}
	assertNothingLeft(t, c, shimID{nsDefault, id})
}

// TestCtrExecNoAgent: a guest booted without its agent (the port is there,
// nothing opened it) fails an exec within 2 s with the message, as exit
// status 126.
func TestCtrExecNoAgent(t *testing.T) {
	s := requireKVM(t, "kernel")
	s.forEachFlavour(t, func(t *testing.T, c *containerd) {
		id := "it-exec-noagent"
		f := c.foregroundVM(t, id, "KVM-GUEST-AGENT off", "--annotation", "kvm.containerd.io/kernel-cmdline=console=ttyS0 kvm-guest.agent=off")
		for i := range 3 {
			start := time.Now()
			r := c.execCtr(nsDefault, id, fmt.Sprintf("noagent-%d", i), "", "true")
			took := time.Since(start)
			if r.Code != 126 || !strings.Contains(r.Stderr, noAgentMessage) {
				t.Errorf("exec without an agent: %v; want exit 126 and %q", r, noAgentMessage)
			}
			if took > 2*time.Second {
				t.Errorf("exec without an agent took %v (ctr included), want under 2 s", took)
			}
			t.Logf("exec without an agent failed after %v (ctr included)", took.Round(time.Millisecond))
		}
		c.killForeground(t, f, id)
	})
}

// execSync runs ExecSync with a timeout in seconds (0: none).
func (cl *criClient) execSync(cid string, timeout int64, cmd ...string) (*cri.ExecSyncResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return cl.Runtime.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: cid, Cmd: cmd, Timeout: timeout})
}

func (cl *criClient) waitAgentCRI(t *testing.T, cid string, timeout time.Duration) {
	t.Helper()
	start := time.Now()
	if err := poll(timeout, func() (bool, string) {
		r, err := cl.execSync(cid, 10, "true")
		if err != nil {
			return false, err.Error()
		}
		return r.ExitCode == 0, fmt.Sprintf("exit %d: %s", r.ExitCode, r.Stderr)
	}); err != nil {
		t.Fatalf("the guest agent never answered: %v", err)
	}
	t.Logf("guest agent answered %v after the wait began", time.Since(start).Round(100*time.Millisecond))
}

// guestUserProcesses counts the guest's processes that are not kernel
// threads (busybox ps shows those in brackets).
func (cl *criClient) guestUserProcesses(t *testing.T, cid string) int {
	t.Helper()
	r, err := cl.execSync(cid, 10, "ps", "-o", "pid,args")
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("ps in the guest: %v %v", r, err)
	}
	n := 0
	for _, l := range strings.Split(strings.TrimSpace(string(r.Stdout)), "\n")[1:] {
		// Kernel threads ([name]) and the short sleeps of /init's polling
		// loops come and go by themselves.
		if f := strings.Fields(l); len(f) > 1 && !strings.HasPrefix(f[1], "[") && f[1] != "sleep" {
			n++
		}
	}
	return n
}

var goroutinesRE = regexp.MustCompile(`goroutines=(\d+)`)

// shimGoroutines returns the goroutine counts the shim logged at each
// exec's end (a debug line) since log offset from.
func (c *containerd) shimGoroutines(from int64) []int {
	b, err := os.ReadFile(c.LogPath)
	if err != nil || int64(len(b)) < from {
		return nil
	}
	var out []int
	for _, l := range strings.Split(string(b[from:]), "\n") {
		if !strings.Contains(l, "exec ended") {
			continue
		}
		if m := goroutinesRE.FindStringSubmatch(l); m != nil {
			n, _ := strconv.Atoi(m[1])
			out = append(out, n)
		}
	}
	return out
}

// TestCRIExecSync: ExecSync (exec probes, kubectl exec without -t) through
// CRI: output and exit codes, a missing command, the timeout (the guest
// process is killed), and a probe-shaped loop, a command every second
// for a minute, with no failure and no leak of guest processes or shim
// goroutines. The flavours run at once: the minute is spent waiting.
func TestCRIExecSync(t *testing.T) {
	s := requireKVM(t, "kernel", "pause")
	s.forEachFlavourAtOnce(t, func(t *testing.T, c *containerd) {
		c.cleanupAfter(t)
		c.watch(t)
		cl := c.cri(t)
		v := c.startPodContainer(t, cl, "vm-exec", "kvm", s.images["kernel"].ref)
		cl.waitContainerState(t, v.cid, cri.ContainerState_CONTAINER_RUNNING, bootTimeout)
		cl.waitAgentCRI(t, v.cid, bootTimeout)

		r, err := cl.execSync(v.cid, 10, "sh", "-c", "echo out; echo err >&2; exit 3")
		if err != nil || r.ExitCode != 3 || string(r.Stdout) != "out\n" || string(r.Stderr) != "err\n" {
			t.Errorf("ExecSync with output: %v %v", r, err)
		}
		r, err = cl.execSync(v.cid, 10, "no-such-command")
		if err != nil || r.ExitCode != 127 || !strings.Contains(string(r.Stderr), "not found") {
			t.Errorf("ExecSync of a missing command: %v %v", r, err)
		}

		// Past its timeout the exec fails and its guest process is killed.
		start := time.Now()
		_, err = cl.execSync(v.cid, 2, "sleep", "600")
		took := time.Since(start)
		if err == nil || !strings.Contains(err.Error(), "timeout") {
			t.Errorf("ExecSync past its timeout: %v", err)
		}
		if took > 10*time.Second {
			t.Errorf("ExecSync with a 2 s timeout returned after %v", took)
		}
		t.Logf("ExecSync with a 2 s timeout returned after %v", took.Round(100*time.Millisecond))
		// By its arguments: the guest's /init has sleeps of its own.
		if r, err := cl.execSync(v.cid, 10, "ps"); err != nil || r.ExitCode != 0 || strings.Contains(string(r.Stdout), "sleep 600") {
			t.Errorf("the timed-out sleep 600 still runs in the guest: %v %v", r, err)
		}

		// The probe shape.
		procsBefore := cl.guestUserProcesses(t, v.cid)
		mark := c.LogSize()
		failures := 0
		var lat []time.Duration
		next := time.Now()
		for range 60 {
			time.Sleep(time.Until(next))
			next = next.Add(time.Second)
			start := time.Now()
			r, err := cl.execSync(v.cid, 5, "true")
			lat = append(lat, time.Since(start))
			if err != nil || r.ExitCode != 0 {
				failures++
				t.Logf("probe failed: %v %v", r, err)
			}
		}
		if failures > 0 {
			t.Errorf("%d of 60 probes failed", failures)
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		t.Logf("probe ExecSync latency: p50 %v, max %v", lat[len(lat)/2].Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))
		if after := cl.guestUserProcesses(t, v.cid); after > procsBefore {
			t.Errorf("guest user processes: %d before the probes, %d after", procsBefore, after)
		}
		g := c.shimGoroutines(mark)
		if len(g) < 60 {
			t.Fatalf("the shim logged %d exec ends with a goroutine count, want 60", len(g))
		}
		first, last := maxOf(g[:10]), maxOf(g[len(g)-10:])
		t.Logf("shim goroutines at exec ends: first ten max %d, last ten max %d", first, last)
		if last > first+2 {
			t.Errorf("shim goroutines grew over the probes: %d → %d (%v)", first, last, g)
		}

		if err := cl.stopContainer(v); err != nil {
			t.Fatal(err)
		}
		cl.removePod(t, v)
		assertNothingLeft(t, c, v.shimIDs()...)
	})
}

func maxOf(v []int) int {
	m := v[0]
	for _, x := range v {
		m = max(m, x)
	}
	return m
}
