package shim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/fifo"
	"github.com/containerd/log"
)

// console joins a VM's first serial port (a unix socket QEMU listens on)
// to the task's stdio: guest output to stdout, stdin to the guest. The
// same output also goes to the console log file through virtlogd, so
// nothing is lost while nobody reads stdout.
type console struct {
	conn   net.Conn
	stdin  io.ReadCloser  // nil when the task has no stdin
	stdout io.WriteCloser // nil when the task has no stdout
	done   chan struct{}  // closed once the guest side hit EOF
	once   sync.Once
}

// checkStdio refuses stdio URIs the shim cannot serve, before anything is
// created.
func checkStdio(io stdio) error {
	for _, p := range []string{io.Stdin, io.Stdout} {
		if p == "" {
			continue
		}
		u, err := url.Parse(p)
		if err != nil {
			return fmt.Errorf("stdio %q: %v: %w", p, err, errdefs.ErrInvalidArgument)
		}
		switch u.Scheme {
		case "", "fifo", "file":
		default:
			return fmt.Errorf("stdio %q: scheme %q is not supported (FIFO paths and file:// are): %w", p, u.Scheme, errdefs.ErrNotImplemented)
		}
	}
	return nil
}

// openStdio opens the task's stdin and stdout. containerd holds the other
// ends open, so opening the FIFOs does not block for long.
func openStdio(ctx context.Context, io stdio) (in io.ReadCloser, out io.WriteCloser, retErr error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if io.Stdout != "" {
		u, _ := url.Parse(io.Stdout)
		var err error
		if u.Scheme == "file" {
			out, err = os.OpenFile(u.Path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
		} else {
			out, err = fifo.OpenFifo(ctx, u.Path, syscall.O_WRONLY, 0)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("open stdout %s: %w", io.Stdout, err)
		}
		defer func() {
			if retErr != nil {
				out.Close()
			}
		}()
	}
	if io.Stdin != "" {
		var err error
		// Opened in the background until containerd's writer shows up: the
		// context must outlive this call, or the open is abandoned.
		in, err = fifo.OpenFifo(context.WithoutCancel(ctx), io.Stdin, syscall.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			return nil, nil, fmt.Errorf("open stdin %s: %w", io.Stdin, err)
		}
	}
	return in, out, nil
}

// attachConsole connects to the serial socket and starts copying.
func attachConsole(ctx context.Context, socket string, in io.ReadCloser, out io.WriteCloser) (*console, error) {
	conn, err := net.DialTimeout("unix", socket, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("connect to VM console %s: %w", socket, err)
	}
	c := &console{conn: conn, stdin: in, stdout: out, done: make(chan struct{})}
	go c.copyOut(ctx)
	if in != nil {
		go func() {
			// Stdin closing (ctr detached) must not close the console.
			_, _ = io.Copy(conn, in)
		}()
	}
	return c, nil
}

// copyOut drains the guest's output for as long as QEMU runs. If the
// reader of stdout goes away the output is still drained (to the log
// file only) so the guest never blocks on a full serial port.
func (c *console) copyOut(ctx context.Context) {
	defer close(c.done)
	var w io.Writer = io.Discard
	if c.stdout != nil {
		w = &forgivingWriter{w: c.stdout}
	}
	if _, err := io.Copy(w, c.conn); err != nil && !isClosedConn(err) {
		log.G(ctx).WithError(err).Debug("console copy ended")
	}
	if c.stdout != nil {
		c.stdout.Close()
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
