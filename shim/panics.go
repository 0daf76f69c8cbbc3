package shim

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"

	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A bug in one request or one background job must not end the shim: the
// shim's death makes containerd run `delete`, which tears down every VM of
// the pod. Panics are recovered at the ttrpc boundary and in every
// goroutine the shim starts, logged with their stack, and turned into an
// error (a request) or a log line (a background job).

// Locks and recovered panics: a task call that panics is recovered and
// the shim carries on, so every lock the call held must be released as
// the panic unwinds, or every later call on that task (or on the whole
// service, for its own locks) would hang: worse than the crash the
// recovery avoids. So every locked section unlocks in a defer: a whole
// function with Lock and a deferred Unlock, a part of one through
// withLock. We chose that over marking a task broken after a panic: a
// mark cannot help when the lock held is the service's (its task map,
// its host), it needs a check in every call, and the calls after a panic
// that matter most, Kill and Delete, should still work on the VM.

// withLock runs fn holding mu, and releases mu even if fn panics.
func withLock(mu sync.Locker, fn func()) {
	mu.Lock()
	defer mu.Unlock()
	fn()
}

// logPanic logs a recovered panic with the stack of the goroutine that
// panicked and returns the error a caller gets for it.
func logPanic(ctx context.Context, what string, r any) error {
	log.G(ctx).WithField("panic", fmt.Sprint(r)).WithField("stack", string(debug.Stack())).
		Errorf("%s panicked; the shim carries on", what)
	return fmt.Errorf("%s: internal error in the kvm shim (panic: %v); see the shim's log", what, r)
}

// recoverCalls is the ttrpc interceptor step that turns a panic in a task
// API method into an Internal error for that call.
func recoverCalls(ctx context.Context, unmarshal ttrpc.Unmarshaler, info *ttrpc.UnaryServerInfo,
	method ttrpc.Method) (resp interface{}, err error) {
	defer func() {
		if r := recover(); r != nil {
			resp, err = nil, status.Error(codes.Internal, logPanic(ctx, info.FullMethod, r).Error())
		}
	}()
	return method(ctx, unmarshal)
}

// goSafe runs fn in a new goroutine; a panic in it is logged, not fatal.
func goSafe(ctx context.Context, what string, fn func()) {
	go func() {
		defer func() {
			if r := recover(); r != nil {
				_ = logPanic(ctx, what, r)
			}
		}()
		fn()
	}()
}

// callSafe runs fn and returns a panic in it as an error, for the steps
// of a long-lived loop that must go on to the next item.
func callSafe(ctx context.Context, what string, fn func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = logPanic(ctx, what, r)
		}
	}()
	fn()
	return nil
}
