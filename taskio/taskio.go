// Package taskio connects the standard streams of a VM task or an exec
// to what containerd names for them: a FIFO path, a file (file://), or a
// logging binary (binary://, as nerdctl gives every detached
// container). It takes plain strings, not containerd API types, and
// refuses what it cannot serve in Check, before anything is opened.
package taskio

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/fifo"
)

// Stdio names a process's streams as containerd gives them; an empty
// name is a stream nobody wants.
type Stdio struct {
	Stdin, Stdout, Stderr string
}

// Schemes of an output URI. A bare path is a FIFO.
const (
	schemeFIFO   = "fifo"
	schemeFile   = "file"
	schemeBinary = "binary"
)

// target is one parsed output name.
type target struct {
	scheme string
	path   string
	uri    *url.URL
}

func parseOutput(name, stream string) (target, error) {
	u, err := url.Parse(name)
	if err != nil {
		return target{}, fmt.Errorf("%s %q: %v: %w", stream, name, err, errdefs.ErrInvalidArgument)
	}
	if (u.Scheme == schemeFIFO || u.Scheme == schemeFile || u.Scheme == schemeBinary) && u.Host != "" {
		// binary://usr/bin/logger would otherwise run /bin/logger.
		return target{}, fmt.Errorf("%s %q names host %q: write %s:///absolute/path: %w",
			stream, name, u.Host, u.Scheme, errdefs.ErrInvalidArgument)
	}
	switch u.Scheme {
	case "":
		// A plain path, taken as it is: url.Parse would cut it at a '?'.
		return target{scheme: schemeFIFO, path: name}, nil
	case schemeFIFO, schemeFile:
		if !filepath.IsAbs(u.Path) {
			return target{}, fmt.Errorf("%s %q: the path must be absolute: %w", stream, name, errdefs.ErrInvalidArgument)
		}
		return target{scheme: u.Scheme, path: u.Path}, nil
	case schemeBinary:
		if err := checkLoggerBinary(u.Path); err != nil {
			return target{}, fmt.Errorf("%s %q: %w", stream, name, err)
		}
		return target{scheme: schemeBinary, path: u.Path, uri: u}, nil
	}
	return target{}, fmt.Errorf("%s %q: scheme %q is not supported (FIFO paths, file:// and binary:// are): %w",
		stream, name, u.Scheme, errdefs.ErrNotImplemented)
}

// checkLoggerBinary refuses a binary:// path that names no executable
// file, so a Create fails with a clear reason before anything is made.
func checkLoggerBinary(path string) error {
	if !filepath.IsAbs(path) {
		return fmt.Errorf("logging binary %q: the path must be absolute: %w", path, errdefs.ErrInvalidArgument)
	}
	st, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("logging binary %s does not exist: %w", path, errdefs.ErrInvalidArgument)
	case err != nil:
		return fmt.Errorf("logging binary %s: %v: %w", path, err, errdefs.ErrInvalidArgument)
	case !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0:
		return fmt.Errorf("logging binary %s is not an executable file (mode %v): %w", path, st.Mode(), errdefs.ErrInvalidArgument)
	}
	return nil
}

// Check refuses stdio the package cannot serve. Stdin is a FIFO; stdout
// and stderr are each a FIFO or a file, or both go to one logging
// binary: a binary:// stdout takes stderr too (as containerd's runc shim
// does), so stderr is then empty or the same URI.
func Check(s Stdio) error {
	if s.Stdin != "" {
		if _, err := stdinPath(s.Stdin); err != nil {
			return err
		}
	}
	var out, errOut target
	var err error
	if s.Stdout != "" {
		if out, err = parseOutput(s.Stdout, "stdout"); err != nil {
			return err
		}
	}
	if s.Stderr != "" {
		if errOut, err = parseOutput(s.Stderr, "stderr"); err != nil {
			return err
		}
	}
	if (out.scheme == schemeBinary || errOut.scheme == schemeBinary) && s.Stderr != "" && s.Stderr != s.Stdout {
		return fmt.Errorf("stdout %q and stderr %q: a logging binary takes both streams, so they must be the same binary:// URI: %w",
			s.Stdout, s.Stderr, errdefs.ErrInvalidArgument)
	}
	return nil
}

func stdinPath(name string) (string, error) {
	u, err := url.Parse(name)
	if err != nil {
		return "", fmt.Errorf("stdin %q: %v: %w", name, err, errdefs.ErrInvalidArgument)
	}
	switch u.Scheme {
	case "":
		return name, nil
	case schemeFIFO:
		return u.Path, nil
	}
	return "", fmt.Errorf("stdin %q: scheme %q is not supported (stdin is a FIFO path): %w", name, u.Scheme, errdefs.ErrNotImplemented)
}

// FIFOMode says how output FIFOs are written.
type FIFOMode int

const (
	// FIFOWait opens an output FIFO in the background and lets a write
	// wait for its reader: an exec's output, written once at its end.
	FIFOWait FIFOMode = iota
	// FIFOStream never holds the writer for long: the FIFO is open at
	// once (with a read end of the shim's own), and output that finds
	// it full for StallTimeout is dropped; a VM's console, which must
	// not stall the guest on its serial port.
	FIFOStream
)

// Options of OpenOutput.
type Options struct {
	// ID and Namespace are given to a logging binary as CONTAINER_ID and
	// CONTAINER_NAMESPACE.
	ID, Namespace string
	FIFO          FIFOMode
	// LoggerReady bounds the wait for a logging binary's readiness
	// (DefaultLoggerReady when 0); LoggerStop bounds its exit after its
	// input ended, and again after SIGTERM, before SIGKILL
	// (DefaultLoggerStop when 0).
	LoggerReady, LoggerStop time.Duration
}

// Defaults of Options.
const (
	DefaultLoggerReady = 10 * time.Second
	DefaultLoggerStop  = 2 * time.Second
)

// Output is a process's stdout and stderr, open. Stdout and Stderr are
// nil for a stream nobody wants.
type Output struct {
	Stdout, Stderr io.Writer

	closers []io.Closer
	logger  *logger
	stream  *streamFIFO // stdout's, when written in FIFOStream mode

	once     sync.Once
	closeErr error
}

// OpenOutput opens s.Stdout and s.Stderr (s.Stdin is ignored). A
// logging binary is started and ready when it returns. On error nothing
// is left open or running.
func OpenOutput(ctx context.Context, s Stdio, o Options) (_ *Output, retErr error) {
	if err := Check(Stdio{Stdout: s.Stdout, Stderr: s.Stderr}); err != nil {
		return nil, err
	}
	out := &Output{}
	defer func() {
		if retErr != nil {
			_ = out.Close()
		}
	}()
	if s.Stdout != "" {
		t, _ := parseOutput(s.Stdout, "stdout")
		if t.scheme == schemeBinary {
			l, err := startLogger(ctx, t.uri, o)
			if err != nil {
				return nil, err
			}
			out.logger = l
			out.Stdout, out.Stderr = l.stdout, l.stderr
			return out, nil
		}
		w, err := out.open(ctx, t, o.FIFO)
		if err != nil {
			return nil, fmt.Errorf("open stdout %s: %w", s.Stdout, err)
		}
		out.Stdout = w
		if f, ok := w.(*streamFIFO); ok {
			out.stream = f
		}
	}
	if s.Stderr != "" {
		t, _ := parseOutput(s.Stderr, "stderr")
		w, err := out.open(ctx, t, o.FIFO)
		if err != nil {
			return nil, fmt.Errorf("open stderr %s: %w", s.Stderr, err)
		}
		out.Stderr = w
	}
	return out, nil
}

func (out *Output) open(ctx context.Context, t target, mode FIFOMode) (io.Writer, error) {
	var w io.WriteCloser
	var err error
	switch {
	case t.scheme == schemeFile:
		w, err = os.OpenFile(t.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	case mode == FIFOStream:
		w, err = openStreamFIFO(t.path)
	default:
		// Opened in the background until the reader shows up: the
		// context must outlive this call, or the open is abandoned.
		w, err = fifo.OpenFifo(context.WithoutCancel(ctx), t.path, syscall.O_WRONLY|syscall.O_NONBLOCK, 0)
	}
	if err != nil {
		return nil, err
	}
	out.closers = append(out.closers, w)
	return w, nil
}

// Dropped tells how many bytes of stdout a FIFOStream dropped while
// nobody read it.
func (out *Output) Dropped() int64 {
	if out.stream == nil {
		return 0
	}
	return out.stream.dropped.Load()
}

// Close closes the streams and ends the logging binary, if any: it gets
// EOF on both, then SIGTERM, then SIGKILL, and is reaped before Close
// returns. Close may be called more than once; only the first acts.
// A write still waiting (for a FIFO's reader, or room in a logger's
// pipe) fails once Close ran.
func (out *Output) Close() error {
	out.once.Do(func() {
		var errs []error
		for _, c := range out.closers {
			errs = append(errs, c.Close())
		}
		if out.logger != nil {
			errs = append(errs, out.logger.stop())
		}
		out.closeErr = errors.Join(errs...)
	})
	return out.closeErr
}

// OpenStdin opens the stdin FIFO at name for reading. With wait 0 it
// returns at once and the open completes in the background when the
// writer comes. With wait > 0 it waits that long for the writer; one
// that never comes is an empty stdin (nil, nil): a client whose input
// had already ended closed its end unopened.
func OpenStdin(ctx context.Context, name string, wait time.Duration) (io.ReadCloser, error) {
	path, err := stdinPath(name)
	if err != nil {
		return nil, err
	}
	if wait == 0 {
		in, openErr := fifo.OpenFifo(context.WithoutCancel(ctx), path, syscall.O_RDONLY|syscall.O_NONBLOCK, 0)
		if openErr != nil {
			return nil, fmt.Errorf("open stdin %s: %w", name, openErr)
		}
		return in, nil
	}
	octx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	in, err := fifo.OpenFifo(octx, path, syscall.O_RDONLY, 0)
	if err != nil {
		if octx.Err() != nil { // no writer in time, or ctx ended: the caller tells which
			return nil, nil
		}
		return nil, fmt.Errorf("open stdin %s: %w", name, err)
	}
	return in, nil
}
