package shim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/log"

	"github.com/kvm-shim/containerd-shim-kvm-v1/taskio"
)

// console joins a VM's first serial port (a unix socket QEMU listens on)
// to the task's stdio: guest output to stdout, stdin to the guest. The
// same output also goes to the console log file through virtlogd, so
// nothing is lost while nobody reads stdout.
type console struct {
	conn  net.Conn
	stdin io.ReadCloser  // nil when the task has no stdin
	out   *taskio.Output // nil when the task has no stdout
	done  chan struct{}  // closed once the guest side hit EOF and out was closed
	once  sync.Once
}

// taskStdio is the task's stdio as the taskio package takes it.
func (s stdio) taskStdio() taskio.Stdio {
	return taskio.Stdio{Stdin: s.Stdin, Stdout: s.Stdout, Stderr: s.Stderr}
}

// checkStdio refuses stdio URIs the shim cannot serve, before anything is
// created.
func checkStdio(s stdio) error {
	return taskio.Check(s.taskStdio())
}

// openStdio opens the VM task's stdin and stdout (the guest's console
// has one output stream). Opening a stdout FIFO never blocks (the shim
// holds a read end of its own); a logging binary is ready when it
// returns; stdin's open waits in the background for containerd's writer.
func openStdio(ctx context.Context, sio stdio, id, namespace string) (io.ReadCloser, *taskio.Output, error) {
	var out *taskio.Output
	if sio.Stdout != "" {
		var err error
		out, err = taskio.OpenOutput(ctx, taskio.Stdio{Stdout: sio.Stdout}, taskio.Options{
			ID: id, Namespace: namespace, FIFO: taskio.FIFOStream,
		})
		if err != nil {
			return nil, nil, err
		}
	}
	var in io.ReadCloser
	if sio.Stdin != "" {
		var err error
		in, err = taskio.OpenStdin(ctx, sio.Stdin, 0)
		if err != nil {
			if out != nil {
				_ = out.Close()
			}
			return nil, nil, err
		}
	}
	return in, out, nil
}

// attachConsole connects to the serial socket and starts copying.
func attachConsole(ctx context.Context, socket string, in io.ReadCloser, out *taskio.Output) (*console, error) {
	conn, err := net.DialTimeout("unix", socket, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("connect to VM console %s: %w", socket, err)
	}
	c := &console{conn: conn, stdin: in, out: out, done: make(chan struct{})}
	goSafe(ctx, "copy the VM console to stdout", func() { c.copyOut(ctx) })
	if in != nil {
		goSafe(ctx, "copy stdin to the VM console", func() {
			// Stdin closing (ctr detached) must not close the console.
			_, _ = io.Copy(conn, in)
		})
	}
	return c, nil
}

// copyOut drains the guest's output for as long as QEMU runs. If the
// reader of stdout goes away the output is still drained (to the log
// file only) so the guest never blocks on a full serial port. It closes
// stdout at the end, which ends a logging binary.
func (c *console) copyOut(ctx context.Context) {
	defer close(c.done)
	w := io.Discard
	if c.out != nil && c.out.Stdout != nil {
		w = &forgivingWriter{w: c.out.Stdout}
	}
	if _, err := io.Copy(w, c.conn); err != nil && !isClosedConn(err) {
		log.G(ctx).WithError(err).Debug("console copy ended")
	}
	if c.out == nil {
		return
	}
	if n := c.out.Dropped(); n > 0 {
		log.G(ctx).WithField("bytes", n).Warn("guest output dropped while nobody read stdout (it is in the console log)")
	}
	if err := c.out.Close(); err != nil {
		log.G(ctx).WithError(err).Warn("close the task's stdout")
	}
}

// waitDrained waits until all guest output reached stdout, at most d.
func (c *console) waitDrained(d time.Duration) {
	select {
	case <-c.done:
	case <-time.After(d):
	}
}

func (c *console) close() {
	c.once.Do(func() {
		c.conn.Close()
		if c.stdin != nil {
			c.stdin.Close()
		}
		<-c.done
	})
}

// forgivingWriter turns into a sink after its first write error.
type forgivingWriter struct {
	w      io.Writer
	broken bool
}

func (f *forgivingWriter) Write(b []byte) (int, error) {
	if !f.broken {
		if _, err := f.w.Write(b); err != nil {
			f.broken = true
		}
	}
	return len(b), nil
}

func isClosedConn(err error) bool {
	return errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET)
}
