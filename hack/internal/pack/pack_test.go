package pack

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCopyFile(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.WriteFile(src, []byte("body"), 0o644); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := CopyFile(&b, src, func(size int64) error {
		_, err := fmt.Fprintf(&b, "[%d]", size)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if b.String() != "[4]body" {
		t.Errorf("got %q", b.String())
	}
	if err := CopyFile(&b, dir, func(int64) error { return nil }); err == nil {
		t.Error("a directory must be refused")
	}
}
