//go:build faultinject

package shim

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A step waits while its hold file exists, shows that it is held, and goes
// on once the file is removed; other steps pass.
func TestFaultPointHoldsStep(t *testing.T) {
	dir := t.TempDir()
	hold, held := filepath.Join(dir, "hold-define"), filepath.Join(dir, "held-define")
	if err := os.WriteFile(hold, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	setFaultDir(dir)
	defer setFaultDir("")
	faultPoint("rootfs") // not held
	done := make(chan struct{})
	go func() { defer close(done); faultPoint("define") }()
	deadline := time.Now().Add(5 * time.Second)
	for !exists(held) {
		if time.Now().After(deadline) {
			t.Fatal("the step never showed it was held")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case <-done:
		t.Fatal("the step went on while its hold file existed")
	case <-time.After(100 * time.Millisecond):
	}
	if err := os.Remove(hold); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the step stayed held after its hold file went")
	}
	if exists(held) {
		t.Error("held file left after the step went on")
	}
}
