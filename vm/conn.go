package vm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket"
)

// DefaultSocket is libvirtd's read-write socket for qemu:///system.
const DefaultSocket = "/var/run/libvirt/libvirt-sock"

// Conn is a connection to libvirtd that reconnects by itself with backoff.
// After each reconnect it sends an EventReconnected so that the owner
// re-reads the state of its domains: nothing is missed while libvirtd was
// away.
//
// It subscribes to no libvirt events: the shim watches its own QEMU
// processes (WatchExit) instead of receiving every domain's lifecycle
// events on the host.
type Conn struct {
	socket string
	events chan Event

	mu   sync.Mutex
	l    *libvirt.Libvirt // guarded by mu; nil while disconnected
	sock net.Conn         // l's socket, guarded by mu
	// back is closed when a lost connection is made again; nil while
	// connected or closed. Guarded by mu.
	back chan struct{}
	// wake makes the reconnect loop try at once, without its backoff: a
	// caller waits for libvirtd (see client).
	wake chan struct{}

	cancel context.CancelFunc // ends the reconnect loop
	done   chan struct{}
	// reconnects counts the connections made again after a loss.
	reconnects atomic.Uint64
}

// Connect dials libvirtd at socketPath. The first connection must succeed
// before ctx ends (its deadline bounds the dial and the handshake: a
// libvirtd that accepts but never answers fails the call then); later
// losses are repaired in the background until Close.
func Connect(ctx context.Context, socketPath string) (*Conn, error) {
	l, sock, err := dial(ctx, socketPath)
	if err != nil {
		return nil, err
	}
	loopCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c := &Conn{
		socket: socketPath,
		events: make(chan Event, 64),
		l:      l,
		sock:   sock,
		cancel: cancel,
		done:   make(chan struct{}),
		wake:   make(chan struct{}, 1),
	}
	go c.run(loopCtx, l)
	return c, nil
}

// dial connects to libvirtd and returns the socket under the client too:
// go-libvirt closes its socket only in a Disconnect that gets libvirtd's
// reply, so a connection that ended any other way (libvirtd restarted, or
// closed its side before that reply) is closed by its owner.
//
// go-libvirt's calls take no context and a read deadline does not help
// (its reader retries timeouts for ever), so ctx is honoured by closing
// the socket when ctx ends: the handshake's pending calls then fail
// with ErrInterrupted.
func dial(ctx context.Context, path string) (l *libvirt.Libvirt, conn net.Conn, retErr error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("connect to libvirtd at %s: %w", path, err)
	}
	d := &ctxDialer{ctx: ctx, path: path}
	stop := context.AfterFunc(ctx, d.abort)
	defer func() {
		if !stop() && retErr == nil {
			// ctx ended while the handshake finished: abort closed
			// (or is closing) the socket.
			retErr = fmt.Errorf("connect to libvirtd at %s: %w", path, context.Cause(ctx))
		}
		if retErr != nil {
			d.abort()
			l, conn = nil, nil
		}
	}()
	l = libvirt.NewWithDialer(d)
	err := l.ConnectToURI(libvirt.QEMUSystem)
	if err == nil {
		// A connection that libvirtd closed while go-libvirt set it up
		// can leave Disconnected() open for good (its watcher ran
		// before the channel was made): one call proves it alive
		// after the channel exists, and a failed one makes the dial
		// fail and be tried again.
		_, err = l.ConnectGetLibVersion()
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, fmt.Errorf("connect to libvirtd at %s: %v: %w", path, err, context.Cause(ctx))
		}
		return nil, nil, fmt.Errorf("connect to libvirtd at %s: %v: %w", path, err, errdefs.ErrUnavailable)
	}
	return l, d.socket(), nil
}

// ctxDialer dials libvirtd's unix socket within its context and
// remembers the connection it made, so that its owner can close it.
type ctxDialer struct {
	ctx  context.Context
	path string

	mu      sync.Mutex
	conn    net.Conn // guarded by mu
	aborted bool     // guarded by mu; a later dial fails
}

var _ socket.Dialer = (*ctxDialer)(nil)

func (d *ctxDialer) Dial() (net.Conn, error) {
	var nd net.Dialer
	conn, err := nd.DialContext(d.ctx, "unix", d.path)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.aborted {
		_ = conn.Close()
		return nil, fmt.Errorf("dial %s: %w", d.path, context.Cause(d.ctx))
	}
	d.conn = conn
	return conn, nil
}

// abort closes the connection made, and makes a later Dial fail.
func (d *ctxDialer) abort() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.aborted = true
	if d.conn != nil {
		_ = d.conn.Close()
	}
}

func (d *ctxDialer) socket() net.Conn {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.conn
}

// Reconnects is how many times the connection was lost and made again.
// A caller that reads it before and after a step knows whether libvirtd
// was away meanwhile.
func (c *Conn) Reconnects() uint64 { return c.reconnects.Load() }

// Connected tells whether the connection to libvirtd is up now, without
// waiting for a reconnect or waking the reconnect loop (which a call
// does): for work that can skip a turn, such as a poll.
func (c *Conn) Connected() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.l != nil
}

// Events delivers EventReconnected after each reconnect. The owner must
// keep reading.
func (c *Conn) Events() <-chan Event { return c.events }

// Close ends the connection and the reconnect loop.
//
// It never blocks for long: the polite disconnect gets two seconds (a
// shim that waits longer is killed by containerd as leaked; closing the
// socket does the rest).
func (c *Conn) Close() error {
	c.cancel()
	<-c.done
	c.mu.Lock()
	l, sock := c.l, c.sock
	c.l, c.sock = nil, nil
	c.mu.Unlock()
	if l == nil {
		return nil
	}
	errc := make(chan error, 1)
	go func() { errc <- l.Disconnect() }()
	var err error
	select {
	case err = <-errc:
		if errors.Is(err, libvirt.ErrInterrupted) {
			// libvirtd closed its side before its reply to the close
			// came: the connection is over, as asked.
			err = nil
		}
	case <-time.After(2 * time.Second):
		err = fmt.Errorf("disconnect from libvirtd at %s: timed out", c.socket)
	}
	// Closing the socket ends a close still in flight and go-libvirt's
	// reader.
	_ = sock.Close()
	return err
}

func (c *Conn) run(ctx context.Context, l *libvirt.Libvirt) {
	defer close(c.done)
	defer close(c.events)
	for {
		select {
		case <-l.Disconnected():
		case <-ctx.Done():
			return
		}
		c.mu.Lock()
		_ = c.sock.Close()
		c.l, c.sock, c.back = nil, nil, make(chan struct{})
		c.mu.Unlock()
		log.G(ctx).WithField("socket", c.socket).Warn("lost connection to libvirtd, reconnecting")

		var sock net.Conn
		var err error
		l, sock, err = c.reconnect(ctx)
		if err != nil {
			return // canceled
		}
		c.mu.Lock()
		c.l, c.sock = l, sock
		c.reconnects.Add(1)
		close(c.back)
		c.back = nil
		c.mu.Unlock()
		log.G(ctx).WithField("socket", c.socket).Info("reconnected to libvirtd")
		select {
		case c.events <- Event{Kind: EventReconnected}:
		case <-ctx.Done():
			return
		}
	}
}

// reconnectAttempt bounds one attempt of the reconnect loop, so that a
// libvirtd that accepts but does not answer (still starting, or hung) is
// dialled again instead of holding the loop.
const reconnectAttempt = 5 * time.Second

func (c *Conn) reconnect(ctx context.Context) (*libvirt.Libvirt, net.Conn, error) {
	backoff := 100 * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(backoff):
		case <-c.wake:
		}
		if backoff < 5*time.Second {
			backoff *= 2
		}
		attemptCtx, cancel := context.WithTimeout(ctx, reconnectAttempt)
		l, sock, err := dial(attemptCtx, c.socket)
		cancel()
		if err != nil {
			log.G(ctx).WithError(err).Debug("libvirtd not back yet")
			continue
		}
		return l, sock, nil
	}
}

// reconnectWait is how long a call waits for a lost connection to come
// back before it gets Unavailable. libvirtd that restarts answers again
// within it; the call makes the reconnect loop try at once, so a call
// right after libvirtd returned does not fail for the loop's backoff.
const reconnectWait = 3 * time.Second

// client returns the live connection. While reconnecting it makes the
// loop try now and waits up to reconnectWait; then Unavailable.
func (c *Conn) client() (*libvirt.Libvirt, error) {
	c.mu.Lock()
	l, back := c.l, c.back
	c.mu.Unlock()
	if l != nil {
		return l, nil
	}
	if back != nil {
		select {
		case c.wake <- struct{}{}:
		default:
		}
		select {
		case <-back:
		case <-time.After(reconnectWait):
		}
		c.mu.Lock()
		l = c.l
		c.mu.Unlock()
		if l != nil {
			return l, nil
		}
	}
	return nil, fmt.Errorf("libvirtd connection lost, reconnecting: %w", errdefs.ErrUnavailable)
}

// Version returns libvirtd's library version as "major.minor.micro".
func (c *Conn) Version() (string, error) {
	l, err := c.client()
	if err != nil {
		return "", err
	}
	v, err := l.ConnectGetLibVersion()
	if err != nil {
		return "", mapError(err, "get libvirt version")
	}
	return fmt.Sprintf("%d.%d.%d", v/1000000, v/1000%1000, v%1000), nil
}

// mapError gives libvirt errors containerd's error classes.
func mapError(err error, what string) error {
	var lerr libvirt.Error
	if errors.As(err, &lerr) {
		switch libvirt.ErrorNumber(lerr.Code) {
		case libvirt.ErrNoDomain:
			return fmt.Errorf("%s: %s: %w", what, lerr.Message, errdefs.ErrNotFound)
		case libvirt.ErrOperationInvalid:
			return fmt.Errorf("%s: %s: %w", what, lerr.Message, errdefs.ErrFailedPrecondition)
		case libvirt.ErrDomExist:
			return fmt.Errorf("%s: %s: %w", what, lerr.Message, errdefs.ErrAlreadyExists)
		}
	}
	return fmt.Errorf("%s: %w", what, err)
}
