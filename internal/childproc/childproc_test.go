package childproc

import (
	"bytes"
	"errors"
	"os/exec"
	"syscall"
	"testing"
)

// waitingReaper collects the exit with wait4 on the pid, as a SIGCHLD
// reaper does, so the command's own Wait can no longer have it.
type waitingReaper struct{ started int }

func (r *waitingReaper) Start(cmd *exec.Cmd) (func() (int, error), error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	r.started++
	return func() (int, error) {
		var ws syscall.WaitStatus
		if _, err := syscall.Wait4(cmd.Process.Pid, &ws, 0, nil); err != nil {
			return -1, err
		}
		_ = cmd.Wait() // ECHILD; copies the output out
		return ws.ExitStatus(), nil
	}, nil
}

func TestRunWithoutReaper(t *testing.T) {
	var out bytes.Buffer
	cmd := exec.Command("sh", "-c", "echo hi; exit 3")
	cmd.Stdout = &out
	err := Run(cmd)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 || out.String() != "hi\n" {
		t.Fatalf("Run = %v, output %q; want exit status 3 and hi", err, out.String())
	}
}

func TestRunWithReaper(t *testing.T) {
	r := &waitingReaper{}
	SetReaper(r)
	defer SetReaper(nil)
	var out bytes.Buffer
	cmd := exec.Command("sh", "-c", "echo hi; exit 3")
	cmd.Stdout = &out
	err := Run(cmd)
	var ee *ExitError
	if r.started != 1 || !errors.As(err, &ee) || ee.Status != 3 || out.String() != "hi\n" {
		t.Fatalf("Run = %v, output %q, started %d; want the reaper's exit status 3 and hi", err, out.String(), r.started)
	}
	if err := Run(exec.Command("true")); err != nil {
		t.Fatalf("Run(true) = %v", err)
	}
}
