package shim

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/containerd/pkg/shutdown"
	"github.com/containerd/errdefs"

	"github.com/kvm-shim/containerd-shim-kvm-v1/config"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// hostFake makes hosts that count their connects and closes; a connect
// waits for release when it is set, and fails with err when that is set.
// Its hosts have no domains and an empty state dir under root.
type hostFake struct {
	release  chan struct{}
	err      error
	root     string
	connects atomic.Int32
	closes   atomic.Int32
}

func (f *hostFake) newHost(context.Context, config.Config, vm.KVMInfo) (*host, error) {
	f.connects.Add(1)
	if f.release != nil {
		<-f.release
	}
	if f.err != nil {
		return nil, f.err
	}
	events := make(chan vm.Event)
	return &host{conn: newFakeDomains(), layout: layout{root: f.root}, events: events, close: func() error {
		f.closes.Add(1)
		close(events)
		return nil
	}}, nil
}

// connecting returns once the first connect has begun.
func (f *hostFake) connecting() {
	for f.connects.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
}

// shutdownInBackground calls Shutdown; the channel closes when it returned.
func shutdownInBackground(t *testing.T, s *service) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		if _, err := s.Shutdown(context.Background(), nil); err != nil {
			t.Error(err)
		}
		close(done)
	}()
	return done
}

func newTestService(t *testing.T, f *hostFake) *service {
	t.Helper()
	ctx, sd := shutdown.WithShutdown(context.Background())
	t.Cleanup(func() { sd.Shutdown(); <-ctx.Done() })
	f.root = t.TempDir()
	return &service{shutdown: sd, tasks: map[string]taskRunner{}, newHost: f.newHost}
}

func TestVMHostConnectsOutsideTheServiceLock(t *testing.T) {
	f := &hostFake{release: make(chan struct{})}
	s := newTestService(t, f)
	cfg := &config.Config{}
	hosts := make(chan *host, 2)
	for range 2 {
		go func() {
			h, err := s.vmHost(context.Background(), cfg)
			if err != nil {
				t.Error(err)
			}
			hosts <- h
		}()
	}
	// While the connect hangs, calls that need the service lock go on.
	f.connecting()
	done := make(chan error, 1)
	go func() { _, err := s.get("nope", ""); done <- err }()
	select {
	case err := <-done:
		if !errdefs.IsNotFound(err) {
			t.Fatalf("get during the connect: %v, want not found", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("get waited for the libvirt connection")
	}
	close(f.release)
	h1, h2 := <-hosts, <-hosts
	if h1 == nil || h1 != h2 {
		t.Fatalf("two callers got hosts %p and %p, want one", h1, h2)
	}
	t.Cleanup(func() { _ = h1.close() })
	if n := f.connects.Load(); n != 1 {
		t.Fatalf("%d connects, want 1", n)
	}
}

func TestShutdownClosesThePreparedHost(t *testing.T) {
	f := &hostFake{release: make(chan struct{})}
	s := newTestService(t, f)
	cfg := &config.Config{}
	prepared := make(chan struct{})
	go func() { s.prepareHost(context.Background(), cfg); close(prepared) }()
	f.connecting()
	// Shutdown waits for the connect in progress, then closes its host.
	shut := shutdownInBackground(t, s)
	select {
	case <-shut:
		t.Fatal("Shutdown returned while the host was still being made")
	case <-time.After(50 * time.Millisecond):
	}
	close(f.release)
	<-prepared
	<-shut
	if n := f.closes.Load(); n != 1 {
		t.Fatalf("host closed %d times, want 1", n)
	}
	// After Shutdown no new connection is made.
	if _, err := s.vmHost(context.Background(), cfg); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("vmHost after Shutdown: %v, want unavailable", err)
	}
	if n := f.connects.Load(); n != 1 {
		t.Fatalf("%d connects, want 1", n)
	}
}

func TestShutdownKeepsTheHostWhileTasksRemain(t *testing.T) {
	f := &hostFake{}
	s := newTestService(t, f)
	if _, err := s.vmHost(context.Background(), &config.Config{}); err != nil {
		t.Fatal(err)
	}
	s.tasks["vm1"] = &vmTask{}
	if _, err := s.Shutdown(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if n := f.closes.Load(); n != 0 {
		t.Fatalf("host closed %d times with a task left", n)
	}
	if _, err := s.vmHost(context.Background(), &config.Config{}); err != nil {
		t.Fatalf("vmHost after a Shutdown that kept the shim: %v", err)
	}
}

func TestShutdownWithTasksLeftDoesNotWait(t *testing.T) {
	f := &hostFake{release: make(chan struct{})}
	defer close(f.release)
	s := newTestService(t, f)
	s.tasks["sandbox"] = &sandboxTask{}
	go s.prepareHost(context.Background(), &config.Config{})
	f.connecting()
	// containerd asks after every task's Delete, with a timeout: the
	// answer must not wait for the connect in progress.
	done := shutdownInBackground(t, s)
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("Shutdown with a task left waited for the libvirt connection")
	}
}

func TestFailedPrepareAnswersTheWaitingCreate(t *testing.T) {
	f := &hostFake{release: make(chan struct{}), err: errors.New("libvirtd is down")}
	s := newTestService(t, f)
	go s.prepareHost(context.Background(), &config.Config{})
	f.connecting()
	// A VM Create arrives while prepareHost dials, and gets its failure
	// instead of dialing a second time.
	got := make(chan error, 1)
	go func() { _, err := s.vmHost(context.Background(), &config.Config{}); got <- err }()
	time.Sleep(20 * time.Millisecond)
	close(f.release)
	if err := <-got; err == nil || err.Error() != "libvirtd is down" {
		t.Fatalf("waiting Create: %v, want the prepare's error", err)
	}
	if n := f.connects.Load(); n != 1 {
		t.Fatalf("%d connects, want 1", n)
	}
	// A later Create tries again.
	if _, err := s.vmHost(context.Background(), &config.Config{}); err == nil {
		t.Fatal("want the fake's error again")
	}
	if n := f.connects.Load(); n != 2 {
		t.Fatalf("%d connects, want 2", n)
	}
}

// Connect answers while a Start holds the task's lock: containerd, when it
// restarts, gives each shim 5 s to answer it and otherwise runs the
// cleanup delete of the task (found by TestFaultInFlight/*/starting/containerd).
func TestConnectAnswersDuringAStart(t *testing.T) {
	s := newTestService(t, &hostFake{})
	vt := &vmTask{proc: newProc("vm1", t.TempDir(), stdio{}, func(any) {})}
	s.tasks["vm1"] = vt
	vt.mu.Lock() // a Start in flight
	got := make(chan error, 1)
	go func() { _, err := s.Connect(context.Background(), &taskAPI.ConnectRequest{ID: "vm1"}); got <- err }()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Connect waited for the Start")
	}
	vt.setRunningLocked(42)
	vt.mu.Unlock()
	r, err := s.Connect(context.Background(), &taskAPI.ConnectRequest{ID: "vm1"})
	if err != nil || r.TaskPid != 42 {
		t.Fatalf("Connect after the start: %v %v, want task pid 42", r, err)
	}
}
