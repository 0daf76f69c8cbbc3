package taskio

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"sort"
	"syscall"
	"time"

	"github.com/containerd/log"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/childproc"
)

// A logging binary (binary:///path?key=value) gets the process's output
// the way containerd's shims hand it over (containerd's
// runtime/v2/logging.Run reads it so): stdout as fd 3, stderr as fd 4, a
// pipe as fd 5 that it closes once ready, CONTAINER_ID and
// CONTAINER_NAMESPACE as its only environment, and each query key
// followed by its first value as arguments (here in key order, where
// containerd's order is a map's).
//
// Why not containerd's own pkg/process.NewBinaryIO, which the module we
// require carries: it leaves reaping to the runc shim's SIGCHLD reaper
// ("don't need to register this with the reaper or wait"), and this
// shim reaps only once plain containers are on (QEMU is libvirt's
// child; helpers are waited for through internal/childproc, which uses
// the reaper when there is one), so its error paths and its SIGTERM
// failure path would leave zombies; it waits for readiness without a bound, under the
// task's lock here; and it hands its write ends only to an exec.Cmd.
// The contract is small; the reaping is what matters, and it is ours.
type logger struct {
	cmd            *exec.Cmd
	stdout, stderr *os.File      // write ends; the binary reads the other ends
	done           chan struct{} // closed once the binary was reaped
	waitErr        error         // its exit; read only after done closed
	stopAfter      time.Duration
}

// startLogger starts the binary u names and waits until it is ready. On
// error the binary is killed and reaped and every pipe closed.
func startLogger(ctx context.Context, u *url.URL, o Options) (_ *logger, retErr error) {
	var files []*os.File // closed on return: the parent's copies of the binary's ends, and on error all
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	pipe := func() (r, w *os.File, err error) {
		r, w, err = os.Pipe()
		if err == nil {
			files = append(files, r, w)
		}
		return r, w, err
	}
	outR, outW, err := pipe()
	if err != nil {
		return nil, fmt.Errorf("logging binary %s: %w", u.Path, err)
	}
	errR, errW, err := pipe()
	if err != nil {
		return nil, fmt.Errorf("logging binary %s: %w", u.Path, err)
	}
	readyR, readyW, err := pipe()
	if err != nil {
		return nil, fmt.Errorf("logging binary %s: %w", u.Path, err)
	}

	cmd := exec.Command(u.Path, loggerArgs(u.Query())...)
	cmd.Env = []string{"CONTAINER_ID=" + o.ID, "CONTAINER_NAMESPACE=" + o.Namespace}
	cmd.ExtraFiles = []*os.File{outR, errR, readyW} // fds 3, 4, 5
	waitCmd, err := childproc.Start(cmd)
	if err != nil {
		return nil, fmt.Errorf("start logging binary %s: %w", u.Path, err)
	}
	l := &logger{cmd: cmd, stdout: outW, stderr: errW, done: make(chan struct{}), stopAfter: o.LoggerStop}
	if l.stopAfter <= 0 {
		l.stopAfter = DefaultLoggerStop
	}
	go func() {
		l.waitErr = waitCmd()
		close(l.done)
	}()
	// Only the binary holds its ends from here on; ours are closed on
	// return (its readiness comes as EOF on readyR).
	files = []*os.File{outR, errR, readyW, readyR}
	defer func() {
		if retErr != nil {
			outW.Close()
			errW.Close()
			l.kill()
		}
	}()
	readyW.Close()

	wait := o.LoggerReady
	if wait <= 0 {
		wait = DefaultLoggerReady
	}
	if err := readyR.SetReadDeadline(time.Now().Add(wait)); err != nil {
		return nil, fmt.Errorf("logging binary %s: %w", u.Path, err)
	}
	// A binary that exits before it is ready closes fd 5 too: EOF either
	// way, as containerd takes it.
	if _, err := readyR.Read(make([]byte, 1)); err != nil && !errors.Is(err, io.EOF) {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, fmt.Errorf("logging binary %s did not get ready (close fd 5) within %v", u.Path, wait)
		}
		return nil, fmt.Errorf("wait for logging binary %s: %w", u.Path, err)
	}
	log.G(ctx).WithField("binary", u.Path).WithField("pid", cmd.Process.Pid).Debug("logging binary ready")
	return l, nil
}

// loggerArgs turns a binary URI's query into arguments: each key in
// order, then its first value.
func loggerArgs(q url.Values) []string {
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var args []string
	for _, k := range keys {
		args = append(args, k)
		if vs := q[k]; len(vs) > 0 {
			args = append(args, vs[0])
		}
	}
	return args
}

// stop ends the binary: EOF on its input first, so it writes out what
// it holds and exits; SIGTERM if it has not within stopAfter; SIGKILL
// after as long again. It returns once the binary was reaped.
func (l *logger) stop() error {
	errs := []error{l.stdout.Close(), l.stderr.Close()}
	select {
	case <-l.done:
		if l.waitErr != nil {
			errs = append(errs, fmt.Errorf("logging binary %s: %w", l.cmd.Path, l.waitErr))
		}
		return errors.Join(errs...)
	case <-time.After(l.stopAfter):
	}
	_ = l.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-l.done:
		return errors.Join(append(errs, fmt.Errorf("logging binary %s needed SIGTERM to exit", l.cmd.Path))...)
	case <-time.After(l.stopAfter):
	}
	l.kill()
	return errors.Join(append(errs, fmt.Errorf("logging binary %s ignored EOF and SIGTERM; killed", l.cmd.Path))...)
}

// kill kills the binary and reaps it.
func (l *logger) kill() {
	_ = l.cmd.Process.Kill()
	<-l.done
}
