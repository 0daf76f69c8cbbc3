package shim

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestMemTrimmerRunsOnceAfterABurst(t *testing.T) {
	var n atomic.Int32
	m := &memTrimmer{free: func() { n.Add(1) }}
	for range 5 {
		m.soon()
		time.Sleep(trimDelay / 10)
	}
	if got := n.Load(); got != 0 {
		t.Fatalf("trimmed %d times during the burst, want 0", got)
	}
	deadline := time.Now().Add(5 * trimDelay)
	for n.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(trimDelay / 2)
	if got := n.Load(); got != 1 {
		t.Fatalf("trimmed %d times after the burst, want 1", got)
	}
}

func TestMemTrimmerStopCancels(t *testing.T) {
	var n atomic.Int32
	m := &memTrimmer{free: func() { n.Add(1) }}
	m.stop() // nothing pending: no-op
	m.soon()
	m.stop()
	time.Sleep(trimDelay + trimDelay/2)
	if got := n.Load(); got != 0 {
		t.Fatalf("trimmed %d times after stop, want 0", got)
	}
}
