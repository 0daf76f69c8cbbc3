package shim

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// TestTransitionsDriveTheVMTask brings a VM task to each status and tries
// every task call there: each is allowed or refused as the table says, and
// a refusal has the class refusal gives (so the table is the behaviour,
// not a description of it).
func TestTransitionsDriveTheVMTask(t *testing.T) {
	for _, status := range statuses {
		for _, s := range steps {
			if s == stepExit {
				continue // QEMU's, not a call: TestExit* cover it
			}
			t.Run(strings.ToLower(status.String())+"/"+string(s), func(t *testing.T) {
				f := newVMFixture(t)
				f.kernelRootfs()
				vt, err := f.create(nil)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = vt.kill(context.Background(), uint32(unix.SIGKILL)); _ = vt.delete(context.Background()) })
				bringTo(t, f, vt, status)
				err = tryStep(t, vt, s)
				want, allowed := next(status, s)
				if !allowed {
					wantErr := refusal(vt.id, status, s)
					if err == nil || errdefs.IsNotFound(err) != errdefs.IsNotFound(wantErr) ||
						errdefs.IsFailedPrecondition(err) != errdefs.IsFailedPrecondition(wantErr) {
						t.Fatalf("%s on a %s task: %v, want refused like %q", s, status, err, wantErr)
					}
					if got, _, _, _ := vt.snapshot(); got != status {
						t.Fatalf("refused %s moved the task from %s to %s", s, status, got)
					}
					return
				}
				if err != nil {
					t.Fatalf("%s on a %s task: %v, want allowed", s, status, err)
				}
				if s == stepKill {
					return // the status follows the exit, not the call
				}
				if got, _, _, _ := vt.snapshot(); got != want {
					t.Fatalf("%s on a %s task left it %s, want %s", s, status, got, want)
				}
			})
		}
	}
}

func bringTo(t *testing.T, f *vmFixture, vt *vmTask, status task.Status) {
	t.Helper()
	ctx := context.Background()
	if status == task.Status_CREATED {
		return
	}
	if _, err := vt.start(ctx); err != nil {
		t.Fatal(err)
	}
	switch status {
	case task.Status_PAUSED:
		if err := vt.pause(ctx); err != nil {
			t.Fatal(err)
		}
	case task.Status_STOPPED:
		f.fake.stop(vt.rec.Domain, vm.StopShutdown)
		select {
		case <-vt.exited:
		case <-time.After(10 * time.Second):
			t.Fatal("the VM's exit was not recorded")
		}
	}
	if got, _, _, _ := vt.snapshot(); got != status {
		t.Fatalf("task is %s, want %s", got, status)
	}
}

func tryStep(t *testing.T, vt *vmTask, s step) error {
	ctx := context.Background()
	switch s {
	case stepStart:
		_, err := vt.start(ctx)
		return err
	case stepExec:
		_, err := vt.addExec(ctx, "e", stdio{}, processSpec(t, "sh"))
		return err
	case stepStats:
		_, err := vt.stats(ctx)
		return err
	case stepResize:
		return vt.update(ctx, &specs.LinuxResources{})
	case stepPause:
		return vt.pause(ctx)
	case stepResume:
		return vt.resume(ctx)
	case stepKill:
		return vt.kill(ctx, uint32(unix.SIGKILL))
	case stepDelete:
		return vt.delete(ctx)
	}
	t.Fatalf("no call for step %s", s)
	return nil
}

// TestTransitionTableInDocs keeps the architecture page's state machine
// the one in the code.
func TestTransitionTableInDocs(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), transitionTable()) {
		t.Fatalf("docs/architecture.md does not hold the task state machine; paste this table into its \"Task states\" section:\n%s",
			transitionTable())
	}
}

// TestEventsPublishedInOnePlace: every task event is built in proc.go, by
// the step that changes the status, so their order follows the state
// machine.
func TestEventsPublishedInOnePlace(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") || name == "proc.go" || name == "events.go" {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if ok {
				if id, ok := sel.X.(*ast.Ident); ok && id.Name == "eventstypes" && strings.HasPrefix(sel.Sel.Name, "Task") {
					t.Errorf("%s: %s builds a task event: publish it from proc.go's step instead", fset.Position(sel.Pos()), sel.Sel.Name)
				}
			}
			return true
		})
	}
}
