package vm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket"
	"github.com/digitalocean/go-libvirt/socket/dialers"
)

// DefaultSocket is libvirtd's read-write socket for qemu:///system.
const DefaultSocket = "/var/run/libvirt/libvirt-sock"

// Conn is a connection to libvirtd that reconnects by itself with backoff
// and re-subscribes to lifecycle events. After each reconnect it sends an
// EventReconnected so that the owner re-reads the state of its domains: no
// exit is missed while libvirtd was away.
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

	cancel context.CancelFunc // ends the forwarding and reconnect loop
	// subCtx carries the event subscriptions. It is canceled only after
	// the disconnect, so that go-libvirt never deregisters a subscription
	// while the connection closes: libvirt 9.0.0 crashes when it handles
	// a client's deregistration and its close at the same time. A
	// subscription ends when its connection does, and libvirtd drops
	// the callbacks of a closed client itself.
	subCtx    context.Context
	subCancel context.CancelFunc
	done      chan struct{}
}

// Connect dials libvirtd at socket and subscribes to lifecycle events. The
// first connection must succeed; later losses are repaired in the
// background until Close.
func Connect(ctx context.Context, socket string) (*Conn, error) {
	l, sock, err := dial(socket)
	if err != nil {
		return nil, err
	}
	loopCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	subCtx, subCancel := context.WithCancel(context.WithoutCancel(ctx))
	c := &Conn{
		socket:    socket,
		events:    make(chan Event, 64),
		l:         l,
		sock:      sock,
		cancel:    cancel,
		subCtx:    subCtx,
		subCancel: subCancel,
		done:      make(chan struct{}),
		wake:      make(chan struct{}, 1),
	}
	lifecycle, err := l.LifecycleEvents(subCtx)
	if err != nil {
		cancel()
		subCancel()
		_ = l.Disconnect()
		_ = sock.Close()
		return nil, fmt.Errorf("subscribe to libvirt lifecycle events: %w", err)
	}
	go c.run(loopCtx, l, lifecycle)
	return c, nil
}

// dial connects to libvirtd and returns the socket under the client too:
// go-libvirt closes its socket only in a Disconnect that gets libvirtd's
// reply, so a connection that ended any other way (libvirtd restarted, or
// closed its side before that reply) is closed by its owner.
func dial(path string) (*libvirt.Libvirt, net.Conn, error) {
	d := &keptDialer{Dialer: dialers.NewLocal(dialers.WithSocket(path), dialers.WithLocalTimeout(5*time.Second))}
	l := libvirt.NewWithDialer(d)
	if err := l.ConnectToURI(libvirt.QEMUSystem); err != nil {
		if d.conn != nil {
			_ = d.conn.Close()
		}
		return nil, nil, fmt.Errorf("connect to libvirtd at %s: %v: %w", path, err, errdefs.ErrUnavailable)
	}
	return l, d.conn, nil
}

// keptDialer remembers the connection it made.
type keptDialer struct {
	socket.Dialer
	conn net.Conn
}

func (d *keptDialer) Dial() (net.Conn, error) {
	conn, err := d.Dialer.Dial()
	if err == nil {
		d.conn = conn
	}
	return conn, err
}

// Events delivers lifecycle events in the order libvirt sent them. The
// owner must keep reading.
func (c *Conn) Events() <-chan Event { return c.events }

// Close ends the connection and the reconnect loop.
//
// It never blocks for long: go-libvirt delivers events to a subscriber
// without a timeout, so the subscription is drained until it ends, and the
// polite disconnect gets two seconds (a shim that waits longer is killed
// by containerd as leaked; closing the socket does the rest).
func (c *Conn) Close() error {
	c.cancel()
	<-c.done
	c.mu.Lock()
	l, sock := c.l, c.sock
	c.l, c.sock = nil, nil
	c.mu.Unlock()
	if l == nil {
		c.subCancel()
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
	// reader. Only then does the subscription end: its deregistration
	// can no longer reach libvirtd while the connection closes.
	_ = sock.Close()
	c.subCancel()
	return err
}

func (c *Conn) run(ctx context.Context, l *libvirt.Libvirt, lifecycle <-chan libvirt.DomainEventLifecycleMsg) {
	defer close(c.done)
	defer close(c.events)
	// go-libvirt's delivery goroutine blocks on its send until someone
	// reads: on every way out, drain the current subscription until
	// Close's disconnect ends it and the channel closes.
	defer func() {
		if lifecycle != nil {
			go func(ch <-chan libvirt.DomainEventLifecycleMsg) {
				for range ch {
				}
			}(lifecycle)
		}
	}()
	for {
		c.pump(ctx, lifecycle)
		if ctx.Err() != nil {
			return
		}
		c.mu.Lock()
		_ = c.sock.Close()
		c.l, c.sock, c.back = nil, nil, make(chan struct{})
		c.mu.Unlock()
		log.G(ctx).WithField("socket", c.socket).Warn("lost connection to libvirtd, reconnecting")

		l, sock, ll, err := c.reconnect(ctx)
		if err != nil {
			return // canceled
		}
		lifecycle = ll
		c.mu.Lock()
		c.l, c.sock = l, sock
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

// pump forwards lifecycle events until the subscription ends (the
// connection dropped) or ctx is canceled.
func (c *Conn) pump(ctx context.Context, lifecycle <-chan libvirt.DomainEventLifecycleMsg) {
	for {
		select {
		case m, ok := <-lifecycle:
			if !ok {
				return
			}
			select {
			case c.events <- eventFromLibvirt(m):
			case <-ctx.Done():
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

func (c *Conn) reconnect(ctx context.Context) (*libvirt.Libvirt, net.Conn, <-chan libvirt.DomainEventLifecycleMsg, error) {
	backoff := 100 * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			return nil, nil, nil, ctx.Err()
		case <-time.After(backoff):
		case <-c.wake:
		}
		if backoff < 5*time.Second {
			backoff *= 2
		}
		l, sock, err := dial(c.socket)
		if err != nil {
			log.G(ctx).WithError(err).Debug("libvirtd not back yet")
			continue
		}
		lifecycle, err := l.LifecycleEvents(c.subCtx)
		if err != nil {
			log.G(ctx).WithError(err).Warn("subscribe to libvirt lifecycle events")
			_ = l.Disconnect()
			_ = sock.Close()
			continue
		}
		return l, sock, lifecycle, nil
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
