package shim

import (
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"testing"
	"testing/synctest"
	"time"

	"github.com/containerd/errdefs"

	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// hungDomains is a libvirtd that stops answering state reads until
// resumed, as one stopped with SIGSTOP.
type hungDomains struct {
	domains
	resumed chan struct{}
}

func (h *hungDomains) State(name string) (vm.State, error) {
	<-h.resumed
	return vm.State{Running: true}, nil
}

func (h *hungDomains) Destroy(name string) error {
	<-h.resumed
	return nil
}

// A hung libvirtd: the first call is DeadlineExceeded at its bound, the
// calls after it Unavailable at once, and once libvirtd answers the late
// call, calls go through again. In synctest's fake time.
func TestBoundedDomainsHungLibvirtd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fake := newFakeDomains()
		fake.doms["d"] = &fakeDomain{running: true}
		hung := &hungDomains{domains: fake, resumed: make(chan struct{})}
		b := newBoundedDomains(hung)

		start := time.Now()
		_, err := b.State("d")
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != queryBound {
			t.Fatalf("state of a hung libvirtd: %v after %v, want DeadlineExceeded after %v", err, time.Since(start), queryBound)
		}
		start = time.Now()
		if err = b.Destroy("d"); !errdefs.IsUnavailable(err) || time.Since(start) != 0 {
			t.Fatalf("destroy while a call is late: %v after %v, want Unavailable at once", err, time.Since(start))
		}
		if _, err = b.Stats("d"); !errdefs.IsUnavailable(err) {
			t.Fatalf("stats while a call is late: %v, want Unavailable", err)
		}

		// A release waits for the late call, up to its wait.
		start = time.Now()
		if b.waitAnswering(time.Second) || time.Since(start) != time.Second {
			t.Fatalf("waitAnswering returned true, or after %v, with libvirtd still hung", time.Since(start))
		}
		released := make(chan bool)
		go func() { released <- b.waitAnswering(changeBound) }()
		time.Sleep(5 * time.Second)
		close(hung.resumed) // SIGCONT
		if !<-released || time.Since(start) != time.Second+5*time.Second {
			t.Fatalf("waitAnswering did not end when libvirtd answered (%v)", time.Since(start))
		}
		synctest.Wait() // the late call returns
		if st, err := b.State("d"); err != nil || !st.Running {
			t.Fatalf("state after libvirtd answered again: %+v, %v", st, err)
		}
		if err := b.Destroy("d"); err != nil {
			t.Fatalf("destroy after libvirtd answered again: %v", err)
		}
	})
}

// A change gets its own, longer bound, and a guest agent call its
// timeout on top.
func TestBoundedDomainsBounds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hung := &hungDomains{domains: newFakeDomains(), resumed: make(chan struct{})}
		b := newBoundedDomains(hung)
		start := time.Now()
		if err := b.Destroy("d"); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != changeBound {
			t.Errorf("destroy: %v after %v, want DeadlineExceeded after %v", err, time.Since(start), changeBound)
		}
		close(hung.resumed)
		synctest.Wait()
	})
}

// Every libvirt call of domains goes through a bound: boundedDomains
// declares each method itself (only Reconnects and Connected, which ask
// libvirtd nothing, are the embedded ones).
func TestBoundedDomainsCoversEveryCall(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "bounded.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	declared := map[string]bool{}
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv != nil {
			declared[fd.Name.Name] = true
		}
	}
	it := reflect.TypeOf((*domains)(nil)).Elem()
	for i := range it.NumMethod() {
		if m := it.Method(i).Name; m != "Reconnects" && m != "Connected" && !declared[m] {
			t.Errorf("boundedDomains does not bound %s: a hung libvirtd would hold it forever", m)
		}
	}
}
