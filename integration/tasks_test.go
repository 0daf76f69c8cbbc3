//go:build integration

package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// taskStatus reads a task's status and pid from `ctr task ls`
// (columns TASK PID STATUS); status is "" when there is no such task.
func (c *containerd) taskStatus(ns, id string) (status string, pid int, err error) {
	r := c.ctr(ns, "task", "ls")
	if r.Err != nil {
		return "", 0, fmt.Errorf("%v", r)
	}
	for _, line := range strings.Split(r.Stdout, "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == id {
			pid, _ := strconv.Atoi(f[1])
			return f[2], pid, nil
		}
	}
	return "", 0, nil
}

// waitTaskStatus polls `ctr task ls` until the task has status.
func (c *containerd) waitTaskStatus(t *testing.T, ns, id, status string, timeout time.Duration) {
	t.Helper()
	if err := c.pollTaskStatus(ns, id, status, timeout); err != nil {
		t.Fatal(err)
	}
}

func (c *containerd) pollTaskStatus(ns, id, status string, timeout time.Duration) error {
	return poll(timeout, func() (bool, string) {
		got, _, err := c.taskStatus(ns, id)
		if err != nil {
			return false, err.Error()
		}
		return got == status, fmt.Sprintf("task %s is %q, want %q", id, got, status)
	})
}

// taskPids lists the pids `ctr task ps` reports (columns PID INFO).
func (c *containerd) taskPids(t *testing.T, ns, id string) []int {
	t.Helper()
	r := c.mustCtr(t, ns, "task", "ps", id)
	var pids []int
	for _, line := range strings.Split(r.Stdout, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] == "PID" {
			continue
		}
		pid, err := strconv.Atoi(f[0])
		if err != nil {
			t.Fatalf("ctr task ps %s: unexpected line %q", id, line)
		}
		pids = append(pids, pid)
	}
	return pids
}

// deleteTask runs `ctr task delete` and checks the exit status of the task.
// ctr (1.6 and 2.x alike) exits 0 and reports a non-zero status only as the
// warning "task <id> exit with non-zero exit code <n>".
func (c *containerd) deleteTask(t *testing.T, ns, id string, wantStatus int) {
	t.Helper()
	r := c.mustCtr(t, ns, "task", "delete", id)
	status := 0
	if m := nonZeroExit.FindStringSubmatch(r.Stderr); m != nil && m[1] == id {
		status, _ = strconv.Atoi(m[2])
	}
	if status != wantStatus {
		t.Fatalf("task %s exit status %d, want %d: %v", id, status, wantStatus, r)
	}
}

var nonZeroExit = regexp.MustCompile(`task (\S+) exit with non-zero exit code (\d+)`)

// exe returns the basename of a live process's executable.
func exe(pid int) (string, error) {
	target, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return "", err
	}
	return filepath.Base(target), nil
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// state follows the parenthesised comm.
	s := string(b)
	i := strings.LastIndex(s, ")")
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z'
}

// foreground is a `ctr run` in the foreground, its output captured.
type foreground struct {
	cmdline string
	out     *syncBuffer
	stdin   io.WriteCloser // kept open: the console has a live stdin
	exited  chan struct{}
	code    int
	waitErr error
}

// runForeground starts `ctr run --rm <args>` and returns at once.
func (c *containerd) runForeground(t *testing.T, ns string, args ...string) *foreground {
	t.Helper()
	cmd := c.CtrCmd(context.Background(), ns, append([]string{"run", "--rm"}, args...)...)
	f := &foreground{cmdline: strings.Join(cmd.Args, " "), out: &syncBuffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = f.out, f.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var err error
	if f.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", f.cmdline, err)
	}
	go func() {
		f.waitErr = cmd.Wait()
		f.code = cmd.ProcessState.ExitCode()
		close(f.exited)
	}()
	t.Cleanup(func() {
		f.stdin.Close()
		select {
		case <-f.exited:
		default:
			t.Logf("cleanup: killing still running %s", f.cmdline)
			_ = cmd.Process.Kill()
			<-f.exited
		}
		if t.Failed() {
			t.Logf("output of %s (tail):\n%s", f.cmdline, testenv.Tail(f.out.String(), 60))
		}
	})
	return f
}

// waitOutput waits until the output contains want; it fails early if ctr exits.
func (f *foreground) waitOutput(t *testing.T, want string, timeout time.Duration) {
	t.Helper()
	if err := poll(timeout, func() (bool, string) {
		if strings.Contains(f.out.String(), want) {
			return true, ""
		}
		select {
		case <-f.exited:
			return true, "" // checked below
		default:
		}
		return false, fmt.Sprintf("no %q in the output of %s", want, f.cmdline)
	}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(f.out.String(), want) {
		t.Fatalf("%s exited with %d (%v) before printing %q", f.cmdline, f.code, f.waitErr, want)
	}
}

// wait waits for ctr to exit and returns its exit status.
func (f *foreground) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-f.exited:
		return f.code
	case <-time.After(timeout):
		t.Fatalf("%s still running after %v", f.cmdline, timeout)
		return -1
	}
}

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer // guarded by mu
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
