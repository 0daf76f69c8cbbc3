package pack

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	if err := WriteFile(out, ".t-*", 0o644, func(w io.Writer) error {
		_, err := io.WriteString(w, "hello")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil || string(b) != "hello" {
		t.Fatalf("read back %q, %v", b, err)
	}
	if fi, _ := os.Stat(out); fi.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, want 0644", fi.Mode())
	}

	failed := errors.New("failed")
	if err := WriteFile(out, ".t-*", 0o644, func(w io.Writer) error {
		_, _ = io.WriteString(w, "half")
		return failed
	}); !errors.Is(err, failed) {
		t.Fatalf("err = %v, want the writer's", err)
	}
	if b, _ := os.ReadFile(out); string(b) != "hello" {
		t.Errorf("a failed write changed the output to %q", b)
	}
	if names, _ := filepath.Glob(filepath.Join(dir, ".t-*")); len(names) != 0 {
		t.Errorf("temporary files left: %v", names)
	}
}

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
