//go:build faultinject

package faultpoint

import (
	"os"
	"testing"
	"time"
)

// A point waits while its hold file exists, shows that it is held, and
// goes on once the file is removed; other points pass.
func TestHoldsPoint(t *testing.T) {
	dir := t.TempDir()
	hold, held := HoldFile(dir, Defined), HeldFile(dir, Defined)
	if err := os.WriteFile(hold, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	SetDir(dir)
	defer SetDir("")
	Hold(Stopping) // not held
	done := make(chan struct{})
	go func() { defer close(done); Hold(Defined) }()
	deadline := time.Now().Add(5 * time.Second)
	for !exists(held) {
		if time.Now().After(deadline) {
			t.Fatal("the point never showed it was held")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case <-done:
		t.Fatal("the point went on while its hold file existed")
	case <-time.After(100 * time.Millisecond):
	}
	if err := os.Remove(hold); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the point stayed held after its hold file went")
	}
	if exists(held) {
		t.Error("held file left after the point went on")
	}
}
