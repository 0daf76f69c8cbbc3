//go:build !faultinject

package shim

import (
	"os"
	"path/filepath"
	"testing"
)

// The shim that ships has no way to be held: a hold file is ignored.
func TestFaultPointInertInDefaultBuild(t *testing.T) {
	if faultInjection {
		t.Fatal("the default build has fault injection on")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "hold-define"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	setFaultDir(dir)
	newPhases().mark("define") // would block forever if the hook were in
	if _, err := os.Lstat(filepath.Join(dir, "held-define")); err == nil {
		t.Error("the default build marked a step held")
	}
}
