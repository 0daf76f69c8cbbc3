package kube

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// process is one component the cluster started, with its log file.
type process struct {
	name    string
	argv    []string
	logPath string

	cmd     *exec.Cmd
	exited  chan struct{} // closed once the process is reaped
	waitErr error         // set before exited is closed
}

// start runs the component, appending its output to its log; it keeps its
// own process group, so a ^C to the test does not kill it before the test
// has cleaned up through it.
func (p *process) start() error {
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	p.cmd = exec.Command(p.argv[0], p.argv[1:]...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	exited := make(chan struct{})
	p.exited = exited
	cmd := p.cmd
	go func() {
		p.waitErr = cmd.Wait()
		close(exited)
	}()
	return nil
}

// running reports whether the process was started and has not exited.
func (p *process) running() bool {
	if p.exited == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM to the process (its pid only) and waits up to grace,
// then kills it. It reports an early exit or a kill.
func (p *process) stop(grace time.Duration) error {
	if p.exited == nil {
		return nil
	}
	select {
	case <-p.exited:
		return fmt.Errorf("%s had exited early: %v", p.name, p.waitErr)
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return nil
	case <-time.After(grace):
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
	return fmt.Errorf("%s ignored SIGTERM for %s; killed", p.name, grace)
}

// stopAll stops ps in order, joining their errors.
func stopAll(grace time.Duration, ps ...*process) error {
	var errs []error
	for _, p := range ps {
		if p != nil {
			errs = append(errs, p.stop(grace))
		}
	}
	return errors.Join(errs...)
}
