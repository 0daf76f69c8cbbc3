package vmtest

import (
	"os"
	"path/filepath"
	"testing"
)

// Tree makes a temporary directory holding each of files (paths relative
// to it, their parents made), empty, and returns it: an image layer or a
// rootfs with the names a test needs.
func Tree(t testing.TB, files ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range files {
		p := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
