package shim

import (
	"context"
	"sync"

	eventstypes "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/runtime"
	"github.com/containerd/containerd/runtime/v2/shim"
	"github.com/containerd/log"
)

// eventQueue publishes task events to containerd one at a time, in the
// order they were sent: Create, Start, Exit, Delete.
type eventQueue struct {
	ch     chan any
	mu     sync.Mutex
	closed bool // guarded by mu
}

func newEventQueue(ctx context.Context, publisher shim.Publisher) *eventQueue {
	q := &eventQueue{ch: make(chan any, 128)}
	ns, _ := namespaces.Namespace(ctx)
	ctx = namespaces.WithNamespace(context.WithoutCancel(ctx), ns)
	go func() {
		for e := range q.ch {
			var err error
			// A panic is logged by callSafe with its stack; the next event goes on.
			_ = callSafe(ctx, "publish event", func() { err = publisher.Publish(ctx, topic(e), e) })
			if err != nil {
				log.G(ctx).WithError(err).Error("publish event")
			}
		}
		publisher.Close()
	}()
	return q
}

func (q *eventQueue) send(e any) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.closed {
		q.ch <- e
	}
}

func (q *eventQueue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.closed {
		q.closed = true
		close(q.ch)
	}
}

func topic(e any) string {
	switch e.(type) {
	case *eventstypes.TaskCreate:
		return runtime.TaskCreateEventTopic
	case *eventstypes.TaskStart:
		return runtime.TaskStartEventTopic
	case *eventstypes.TaskExit:
		return runtime.TaskExitEventTopic
	case *eventstypes.TaskDelete:
		return runtime.TaskDeleteEventTopic
	case *eventstypes.TaskPaused:
		return runtime.TaskPausedEventTopic
	case *eventstypes.TaskResumed:
		return runtime.TaskResumedEventTopic
	case *eventstypes.TaskExecAdded:
		return runtime.TaskExecAddedEventTopic
	case *eventstypes.TaskExecStarted:
		return runtime.TaskExecStartedEventTopic
	case *eventstypes.TaskOOM:
		return runtime.TaskOOMEventTopic
	}
	return runtime.TaskUnknownTopic
}
