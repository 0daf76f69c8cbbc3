package shim

import (
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/ttrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kvm-shim/containerd-shim-kvm-v1/config"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm/vmtest"
)

// panicOnExit wraps a task's publish so that a TaskExit panics, as a bug
// in the event path would, and hit is closed when it did. Other events
// go through.
func panicOnExit(next func(any), hit chan struct{}) func(any) {
	return func(e any) {
		if _, ok := e.(*eventstypes.TaskExit); ok {
			close(hit)
			panic("injected bug in publish")
		}
		next(e)
	}
}

// panickyDomains is libvirt whose method named panics panics, as a bug
// in the libvirt client would; the rest is the fake's.
type panickyDomains struct {
	domains
	panics string
}

func (p *panickyDomains) check(method string) {
	if method == p.panics {
		panic("injected bug in " + method)
	}
}

func (p *panickyDomains) Start(name string, paused bool) error {
	p.check("Start")
	return p.domains.Start(name, paused)
}

func (p *panickyDomains) Suspend(name string) error {
	p.check("Suspend")
	return p.domains.Suspend(name)
}

func (p *panickyDomains) VCPUs(name string) (int, error) {
	p.check("VCPUs")
	return p.domains.VCPUs(name)
}

// recovered runs a task API call as the ttrpc interceptor does and
// returns its error, which must be the recovered panic.
func recovered(t *testing.T, what string, call func(context.Context) error) {
	t.Helper()
	info := &ttrpc.UnaryServerInfo{FullMethod: what}
	_, err := recoverCalls(context.Background(), nil, info, func(ctx context.Context, _ func(any) error) (any, error) {
		return nil, call(ctx)
	})
	if err == nil || !strings.Contains(err.Error(), "injected bug") {
		t.Fatalf("%s: %v, want the injected panic, recovered", what, err)
	}
}

// answers fails the test unless call returns within two seconds: a call
// that waits for a lock a recovered panic left held never does.
func answers(t *testing.T, what string, call func(context.Context) error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- fmt.Errorf("panic: %v", r) // the dependency still panics: an answer too
			}
		}()
		done <- call(context.Background())
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(2 * time.Second):
		t.Fatalf("%s hangs after a recovered panic: a lock is still held", what)
		return nil
	}
}

// waitHit waits for an injected panic that happens off the call path.
func waitHit(t *testing.T, hit chan struct{}) {
	t.Helper()
	select {
	case <-hit:
		time.Sleep(50 * time.Millisecond) // the goroutine unwinds
	case <-time.After(5 * time.Second):
		t.Fatal("the injected panic never happened")
	}
}

func state(s *service, id, execID string) func(context.Context) error {
	return func(ctx context.Context) error {
		_, err := s.State(ctx, &taskAPI.StateRequest{ID: id, ExecID: execID})
		return err
	}
}

func killCall(s *service, id, execID string, sig unix.Signal) func(context.Context) error {
	return func(ctx context.Context) error {
		_, err := s.Kill(ctx, &taskAPI.KillRequest{ID: id, ExecID: execID, Signal: uint32(sig)})
		return err
	}
}

// TestCallsAnswerAfterAPanicUnderALock panics inside each kind of locked
// section (a task's, an exec's, a sandbox's, a resize's, the service's)
// through a dependency injected on the struct, recovers it as the ttrpc
// interceptor or goSafe does, and checks that the next call on the same
// task answers: no lock was left held.
func TestCallsAnswerAfterAPanicUnderALock(t *testing.T) {
	ctx := context.Background()
	t.Run("task kill before start", func(t *testing.T) {
		f := newVMFixture(t)
		vt := f.created()
		vt.publish = panicOnExit(vt.publish, make(chan struct{}))
		s := newTestService(t, &hostFake{})
		s.tasks["vm1"] = vt
		recovered(t, "Kill", killCall(s, "vm1", "", unix.SIGKILL))
		_ = answers(t, "State", state(s, "vm1", ""))
		_ = answers(t, "Kill", killCall(s, "vm1", "", unix.SIGKILL))
	})
	t.Run("task start", func(t *testing.T) {
		f := newVMFixture(t)
		vt := f.created()
		f.host.conn = &panickyDomains{domains: f.fake, panics: "Start"}
		s := newTestService(t, &hostFake{})
		s.trim = newMemTrimmer()
		t.Cleanup(s.trim.stop)
		s.tasks["vm1"] = vt
		recovered(t, "Start", func(ctx context.Context) error {
			_, err := s.Start(ctx, &taskAPI.StartRequest{ID: "vm1"})
			return err
		})
		_ = answers(t, "State", state(s, "vm1", ""))
		f.host.conn = f.fake
		if err := answers(t, "Start", func(ctx context.Context) error {
			_, err := s.Start(ctx, &taskAPI.StartRequest{ID: "vm1"})
			return err
		}); err != nil {
			t.Fatalf("start after the panic: %v", err)
		}
	})
	t.Run("task pause", func(t *testing.T) {
		f := newVMFixture(t)
		vt := f.started()
		f.host.conn = &panickyDomains{domains: f.fake, panics: "Suspend"}
		s := newTestService(t, &hostFake{})
		s.tasks["vm1"] = vt
		recovered(t, "Pause", func(ctx context.Context) error {
			_, err := s.Pause(ctx, &taskAPI.PauseRequest{ID: "vm1"})
			return err
		})
		_ = answers(t, "State", state(s, "vm1", ""))
		if err := answers(t, "Kill", killCall(s, "vm1", "", unix.SIGKILL)); err != nil {
			t.Fatalf("kill after the panic: %v", err)
		}
	})
	t.Run("task resize", func(t *testing.T) {
		f := newVMFixture(t)
		vt := f.started()
		f.host.conn = &panickyDomains{domains: f.fake, panics: "VCPUs"}
		s := newTestService(t, &hostFake{})
		s.tasks["vm1"] = vt
		res, err := json.Marshal(specs.LinuxResources{CPU: &specs.LinuxCPU{Shares: ptr(uint64(1024))}})
		if err != nil {
			t.Fatal(err)
		}
		update := func(ctx context.Context) error {
			_, err := s.Update(ctx, &taskAPI.UpdateTaskRequest{ID: "vm1", Resources: &anypb.Any{
				TypeUrl: "types.containerd.io/opencontainers/runtime-spec/1/LinuxResources", Value: res}})
			return err
		}
		recovered(t, "Update", update)
		_ = answers(t, "State", state(s, "vm1", ""))
		_ = answers(t, "Update", update)
	})
	t.Run("task exit", func(t *testing.T) {
		f := newVMFixture(t)
		vt := f.started()
		hit := make(chan struct{})
		vt.publish = panicOnExit(vt.publish, hit)
		s := newTestService(t, &hostFake{})
		s.tasks["vm1"] = vt
		f.fake.stop(vt.rec.Domain, vm.StopDestroyed) // followExit records the exit
		waitHit(t, hit)
		_ = answers(t, "State", state(s, "vm1", ""))
		_ = answers(t, "Kill", killCall(s, "vm1", "", unix.SIGKILL))
	})
	t.Run("exec kill before start", func(t *testing.T) {
		f := newVMFixture(t)
		vt := f.started()
		vt.publish = panicOnExit(vt.publish, make(chan struct{})) // an exec publishes through its task's
		s := newTestService(t, &hostFake{})
		s.tasks["vm1"] = vt
		if _, err := vt.addExec(ctx, "e1", stdio{}, processSpec(t, "true")); err != nil {
			t.Fatal(err)
		}
		recovered(t, "Kill", killCall(s, "vm1", "e1", unix.SIGKILL))
		_ = answers(t, "State", state(s, "vm1", "e1"))
		_ = answers(t, "Kill", killCall(s, "vm1", "e1", unix.SIGKILL))
		_ = answers(t, "Exec", func(ctx context.Context) error {
			_, err := s.Exec(ctx, &taskAPI.ExecProcessRequest{ID: "vm1", ExecID: "e2", Spec: processSpec(t, "true")})
			return err
		})
	})
	t.Run("exec exit", func(t *testing.T) {
		f := newVMFixture(t)
		vt := f.started()
		f.fake.guest.SetProgram("true", vmtest.Program{})
		hit := make(chan struct{})
		vt.publish = panicOnExit(vt.publish, hit)
		s := newTestService(t, &hostFake{})
		s.tasks["vm1"] = vt
		e, err := vt.addExec(ctx, "e1", stdio{}, processSpec(t, "true"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.start(ctx); err != nil {
			t.Fatal(err)
		}
		waitHit(t, hit) // the exec's run records its exit
		_ = answers(t, "State", state(s, "vm1", "e1"))
		_ = answers(t, "Kill", killCall(s, "vm1", "e1", unix.SIGKILL))
	})
	t.Run("sandbox kill", func(t *testing.T) {
		sb := newSandbox(t, layout{root: t.TempDir()}, "sb1", "pod-1")
		if _, err := sb.start(ctx); err != nil {
			t.Fatal(err)
		}
		sb.publish = panicOnExit(sb.publish, make(chan struct{}))
		s := newTestService(t, &hostFake{})
		s.tasks["sb1"] = sb
		recovered(t, "Kill", killCall(s, "sb1", "", unix.SIGTERM))
		_ = answers(t, "State", state(s, "sb1", ""))
		_ = answers(t, "Kill", killCall(s, "sb1", "", unix.SIGTERM))
	})
	t.Run("service host", func(t *testing.T) {
		s := newTestService(t, &hostFake{})
		s.newHost = func(context.Context, config.Config, vm.KVMInfo) (*host, error) { panic("injected bug in newHost") }
		cfg := config.Default()
		recovered(t, "vmHost", func(ctx context.Context) error { _, err := s.vmHost(ctx, &cfg); return err })
		_ = answers(t, "vmHost", func(ctx context.Context) error { _, err := s.vmHost(ctx, &cfg); return err })
		_ = answers(t, "State", state(s, "none", ""))
		_ = answers(t, "Shutdown", func(ctx context.Context) error { _, err := s.Shutdown(ctx, &taskAPI.ShutdownRequest{}); return err })
	})
}

func ptr[T any](v T) *T { return &v }

// TestEveryLockIsReleasedByDefer keeps the rule of panics.go: in the
// shim's code every Lock is followed at once by a deferred Unlock of the
// same mutex (withLock does it for a part of a function), so a recovered
// panic can never leave a lock held.
func TestEveryLockIsReleasedByDefer(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	locks := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			var list []ast.Stmt
			switch b := n.(type) {
			case *ast.BlockStmt:
				list = b.List
			case *ast.CaseClause:
				list = b.Body
			case *ast.CommClause:
				list = b.Body
			default:
				return true
			}
			for i, st := range list {
				mu, ok := lockCall(st)
				if !ok {
					continue
				}
				locks++
				if i+1 >= len(list) || !isDeferredUnlock(list[i+1], mu) {
					t.Errorf("%s: %s.Lock() is not followed by defer %s.Unlock(): a recovered panic would leave it held (use withLock)",
						fset.Position(st.Pos()), mu, mu)
				}
			}
			return true
		})
	}
	if locks == 0 {
		t.Fatal("found no Lock call at all: the check reads nothing")
	}
}

// lockCall reports the mutex of a statement `x.Lock()` or `x.RLock()`.
func lockCall(st ast.Stmt) (string, bool) {
	es, ok := st.(*ast.ExprStmt)
	if !ok {
		return "", false
	}
	return methodCall(es.X, "Lock", "RLock")
}

func isDeferredUnlock(st ast.Stmt, mu string) bool {
	d, ok := st.(*ast.DeferStmt)
	if !ok {
		return false
	}
	got, ok := methodCall(d.Call, "Unlock", "RUnlock")
	return ok && got == mu
}

// methodCall reports the receiver of a call to one of the methods named.
func methodCall(e ast.Expr, names ...string) (string, bool) {
	call, ok := e.(*ast.CallExpr)
	if !ok || len(call.Args) != 0 {
		return "", false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return "", false
	}
	for _, n := range names {
		if sel.Sel.Name == n {
			return exprString(sel.X), true
		}
	}
	return "", false
}

func exprString(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.Ident:
		return x.Name
	case *ast.SelectorExpr:
		return exprString(x.X) + "." + x.Sel.Name
	}
	return fmt.Sprintf("%T", e)
}
