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

	"github.com/containerd/errdefs"
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
func checkStdio(streams stdio) error {
	for _, p := range []string{streams.Stdin, streams.Stdout} {
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

// openStdio opens the task's stdin and stdout. Opening the stdout FIFO
// never blocks (the shim holds a read end of its own); stdin's open waits
// in the background for containerd's writer.
func openStdio(ctx context.Context, sio stdio) (io.ReadCloser, io.WriteCloser, error) {
	var out io.WriteCloser
	if sio.Stdout != "" {
		u, _ := url.Parse(sio.Stdout)
		var err error
		if u.Scheme == "file" {
			out, err = os.OpenFile(u.Path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
		} else {
			out, err = openStdoutFIFO(u.Path)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("open stdout %s: %w", sio.Stdout, err)
		}
	}
	var in io.ReadCloser
	if sio.Stdin != "" {
		var err error
		// Opened in the background until containerd's writer shows up: the
		// context must outlive this call, or the open is abandoned.
		in, err = fifo.OpenFifo(context.WithoutCancel(ctx), sio.Stdin, syscall.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			if out != nil {
				out.Close()
			}
			return nil, nil, fmt.Errorf("open stdin %s: %w", sio.Stdin, err)
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
// file only) so the guest never blocks on a full serial port.
func (c *console) copyOut(ctx context.Context) {
	defer close(c.done)
	w := io.Discard
	if c.stdout != nil {
		w = &forgivingWriter{w: c.stdout}
	}
	if _, err := io.Copy(w, c.conn); err != nil && !isClosedConn(err) {
		log.G(ctx).WithError(err).Debug("console copy ended")
	}
	if f, ok := c.stdout.(*stdoutFIFO); ok && f.dropped > 0 {
		log.G(ctx).WithField("bytes", f.dropped).Warn("guest output dropped while nobody read stdout (it is in the console log)")
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

// stallTimeout is how long guest output waits for a full stdout FIFO
// before it is dropped.
const stallTimeout = time.Second

// stdoutFIFO writes guest output to containerd's stdout FIFO. It holds a
// read end of its own (never read), as runc's shim does, so a write never
// fails with EPIPE while containerd is away: when containerd restarts, it
// reopens the FIFO and the output goes on reaching the container log.
// Meanwhile the FIFO fills; a write that waits stallTimeout for room is
// dropped, and further writes are dropped at once until one fits again,
// so the guest is never held on its serial port by a reader that is gone.
type stdoutFIFO struct {
	r, w     *os.File
	dropping bool
	dropped  int64 // bytes of output dropped since open
}

func openStdoutFIFO(path string) (*stdoutFIFO, error) {
	r, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	st, err := r.Stat()
	if err == nil && st.Mode()&os.ModeNamedPipe == 0 {
		err = fmt.Errorf("%s is not a FIFO", path)
	}
	var w *os.File
	if err == nil {
		w, err = os.OpenFile(path, os.O_WRONLY, 0) // returns at once: a reader (r) is there
	}
	if err != nil {
		r.Close()
		return nil, err
	}
	return &stdoutFIFO{r: r, w: w}, nil
}

func (f *stdoutFIFO) Write(b []byte) (int, error) {
	deadline := time.Now().Add(stallTimeout)
	if f.dropping {
		// Room now or never. (A deadline already past would fail the
		// write before it is tried.)
		deadline = time.Now().Add(time.Millisecond)
	}
	if err := f.w.SetWriteDeadline(deadline); err != nil {
		return 0, err
	}
	n, err := f.w.Write(b)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		f.dropping = true
		f.dropped += int64(len(b) - n)
		return len(b), nil
	}
	f.dropping = false
	return n, err
}

func (f *stdoutFIFO) Close() error {
	return errors.Join(f.w.Close(), f.r.Close())
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
