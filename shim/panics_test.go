package shim

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// panickyTask is a task whose kill panics, as a bug in a method would.
type panickyTask struct{ proc }

func (p *panickyTask) start(context.Context) (int, error) { return 0, nil }
func (p *panickyTask) kill(context.Context, uint32) error { panic("injected bug in kill") }
func (p *panickyTask) pause(context.Context) error        { return nil }
func (p *panickyTask) resume(context.Context) error       { return nil }

// logBuffer gives a context whose logger writes into a buffer.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func loggingContext() (context.Context, *logBuffer) {
	b := &logBuffer{}
	l := logrus.New()
	l.Out = b
	return log.WithLogger(context.Background(), logrus.NewEntry(l)), b
}

// TestPanicInMethodBecomesInternalError serves the task API over a real
// ttrpc connection with the shim's interceptor: a panic in Kill reaches
// the client as Internal, is logged with its stack, and the shim goes on
// answering.
func TestPanicInMethodBecomesInternalError(t *testing.T) {
	s := newTestService(t, &hostFake{})
	s.tasks["bug"] = &panickyTask{proc: newProc("bug", "/b", stdio{}, func(any) {})}

	ctx, logs := loggingContext()
	server, err := ttrpc.NewServer(ttrpc.WithUnaryServerInterceptor(s.UnaryInterceptor()))
	if err != nil {
		t.Fatal(err)
	}
	if err = s.RegisterTTRPC(server); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = server.Serve(ctx, l) }()
	t.Cleanup(func() { _ = server.Close() })
	conn, err := net.Dial("unix", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	client := ttrpc.NewClient(conn)
	t.Cleanup(func() { _ = client.Close() })
	tasks := taskAPI.NewTaskClient(client)

	callCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = tasks.Kill(callCtx, &taskAPI.KillRequest{ID: "bug", Signal: 15})
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "injected bug in kill") {
		t.Fatalf("Kill: got %v, want an Internal error naming the panic", err)
	}
	// The same connection still serves calls.
	st, err := tasks.State(callCtx, &taskAPI.StateRequest{ID: "bug"})
	if err != nil || st.ID != "bug" {
		t.Fatalf("State after the panic: %v, %v", st, err)
	}
	if out := logs.String(); !strings.Contains(out, "panicked") || !strings.Contains(out, "panics_test.go") {
		t.Errorf("the panic was not logged with its stack:\n%s", out)
	}
}

func TestGoSafeRecoversAndLogs(t *testing.T) {
	ctx, logs := loggingContext()
	done := make(chan struct{})
	goSafe(ctx, "a background job", func() {
		defer close(done)
		var m map[string]int
		m["boom"]++ //nolint:staticcheck // a nil map write: the runtime panic under test
	})
	<-done
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "a background job panicked") {
		if time.Now().After(deadline) {
			t.Fatalf("no log of the recovered panic:\n%s", logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !strings.Contains(logs.String(), "assignment to entry in nil map") {
		t.Errorf("the log does not say what panicked:\n%s", logs.String())
	}
}

func TestCallSafeReturnsThePanicAsError(t *testing.T) {
	ctx, _ := loggingContext()
	err := callSafe(ctx, "publish event", func() { panic("publisher bug") })
	if err == nil || !strings.Contains(err.Error(), "publisher bug") {
		t.Fatalf("callSafe: %v", err)
	}
	if err := callSafe(ctx, "publish event", func() {}); err != nil {
		t.Fatalf("callSafe without a panic: %v", err)
	}
}
