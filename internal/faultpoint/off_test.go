//go:build !faultinject

package faultpoint

import (
	"os"
	"testing"
)

// The shim that ships has no way to be held: a hold file is ignored.
func TestInertInDefaultBuild(t *testing.T) {
	if Enabled {
		t.Fatal("the default build has fault injection on")
	}
	dir := t.TempDir()
	if err := os.WriteFile(HoldFile(dir, Defined), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	SetDir(dir)
	Hold(Defined) // would block forever if this build could hold
	if _, err := os.Lstat(HeldFile(dir, Defined)); err == nil {
		t.Error("the default build marked a point held")
	}
}
