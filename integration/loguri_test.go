//go:build integration

package integration

import (
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

var (
	testLoggerOnce sync.Once
	testLoggerPath string
	testLoggerErr  error
)

// testLogger builds hack/testlogger (a logging binary on containerd's
// own logger library) once per run and returns its path.
func (s *testSuite) testLogger(t *testing.T) string {
	t.Helper()
	testLoggerOnce.Do(func() {
		testLoggerPath = filepath.Join(s.tmp, "testlogger", "kvm-test-logger")
		cmd := exec.Command("go", "build", "-o", testLoggerPath, "./hack/testlogger")
		cmd.Dir = s.repo
		if out, err := cmd.CombinedOutput(); err != nil {
			testLoggerErr = fmt.Errorf("go build ./hack/testlogger: %v: %s", err, out)
		}
	})
	if testLoggerErr != nil {
		t.Fatal(testLoggerErr)
	}
	return testLoggerPath
}

// loggerProcesses lists the live processes running the logger binary.
func loggerProcesses(bin string) []testenv.Process {
	return testenv.ProcessesMatching(func(args []string) bool { return args[0] == bin })
}

// pipeHolders lists the processes (pid and fd) that hold any of the
// pipes, given as their /proc fd link text ("pipe:[123]").
func pipeHolders(pipes map[string]bool) []string {
	var found []string
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		fds, err := os.ReadDir(filepath.Join("/proc", p.Name(), "fd"))
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if l, err := os.Readlink(filepath.Join("/proc", p.Name(), "fd", fd.Name())); err == nil && pipes[l] {
				found = append(found, fmt.Sprintf("pid %s fd %s (%s)", p.Name(), fd.Name(), l))
			}
		}
	}
	return found
}

// TestCtrLogURIBinary: `ctr run -d --log-uri binary://...` (what nerdctl
// gives every detached container) hands the VM's console to the logging
// binary, which sees the container's id and namespace; after kill and
// delete no logger process is left, and no process holds the pipes the
// logger read.
func TestCtrLogURIBinary(t *testing.T) {
	s := requireKVM(t, "kernel")
	logger := s.testLogger(t)
	s.forEachFlavour(t, func(t *testing.T, c *containerd) {
		c.cleanupAfter(t)
		id := "it-kernel-logger"
		logFile := filepath.Join(t.TempDir(), "console.log")
		uri := (&url.URL{Scheme: "binary", Path: logger, RawQuery: url.Values{"file": {logFile}}.Encode()}).String()
		c.mustCtr(t, nsDefault, append([]string{"run", "-d", "--log-uri", uri}, c.kvmRun(s.images["kernel"].ref, id)...)...)
		c.waitTaskStatus(t, nsDefault, id, "RUNNING", bootTimeout)

		var got string
		if err := poll(bootTimeout, func() (bool, string) {
			b, _ := os.ReadFile(logFile)
			got = string(b)
			return strings.Contains(got, readyLine),
				fmt.Sprintf("%s never reached the logger's file %s; it holds %q", readyLine, logFile, lastLines(got, 5))
		}); err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("testlogger id=%s namespace=%s\n", id, nsDefault); !strings.HasPrefix(got, want) {
			t.Errorf("the logger's header is %q, want %q", strings.SplitN(got, "\n", 2)[0], strings.TrimSpace(want))
		}
		procs := loggerProcesses(logger)
		if len(procs) != 1 {
			t.Fatalf("logger processes while the VM runs: %v, want one", procs)
		}
		pipes := map[string]bool{}
		for _, fd := range []string{"3", "4"} {
			l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", procs[0].Pid, fd))
			if err != nil || !strings.HasPrefix(l, "pipe:") {
				t.Fatalf("logger fd %s is %q (%v), want a pipe", fd, l, err)
			}
			pipes[l] = true
		}
		if h := pipeHolders(pipes); len(h) < 4 { // the logger's read ends (fds 3, 4) and the shim's write ends
			t.Fatalf("holders of the logger's pipes: %v; want the logger's and the shim's", h)
		}

		c.mustCtr(t, nsDefault, "task", "kill", "-s", "KILL", id)
		c.waitTaskStatus(t, nsDefault, id, "STOPPED", stopTimeout)
		c.deleteTask(t, nsDefault, id, 137)
		// The task's delete ends and reaps the logger before it answers.
		if left := loggerProcesses(logger); len(left) != 0 {
			t.Errorf("logger processes after the task's delete: %v", left)
		}
		if h := pipeHolders(pipes); len(h) != 0 {
			t.Errorf("the logger's pipes are still held after the task's delete: %v", h)
		}
		c.mustCtr(t, nsDefault, "containers", "delete", id)
		assertNothingLeft(t, c, shimID{nsDefault, id})
	})
}

// TestCtrLogURIMissingBinary: a binary:// URI whose binary does not exist
// is refused with an error naming it, and nothing is left.
func TestCtrLogURIMissingBinary(t *testing.T) {
	s := requireKVM(t, "kernel")
	s.forEachFlavour(t, func(t *testing.T, c *containerd) {
		c.cleanupAfter(t)
		missing := filepath.Join(s.tmp, "no-such-logger")
		c.ctrRunFails(t, "it-bad-logger", "kernel", []string{"--log-uri", "binary://" + missing + "?file=/dev/null"},
			[]string{"logging binary " + missing + " does not exist", "invalid argument"})
	})
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
