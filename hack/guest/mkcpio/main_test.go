package main

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

type parsed struct {
	name                string
	mode, mtime, nlink  uint64
	rmajor, rminor, uid uint64
	body                string
}

// parseNewc reads a newc archive up to its trailer.
func parseNewc(t *testing.T, b []byte) []parsed {
	t.Helper()
	var out []parsed
	off := 0
	align := func() { off = (off + 3) &^ 3 }
	for {
		if len(b)-off < 110 || string(b[off:off+6]) != "070701" {
			t.Fatalf("bad header at %d", off)
		}
		field := func(i int) uint64 {
			v, err := strconv.ParseUint(string(b[off+6+8*i:off+14+8*i]), 16, 32)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		p := parsed{mode: field(1), uid: field(2), nlink: field(4), mtime: field(5), rmajor: field(9), rminor: field(10)}
		size, namesize := int(field(6)), int(field(11))
		off += 110
		p.name = string(b[off : off+namesize-1])
		off += namesize
		align()
		p.body = string(b[off : off+size])
		off += size
		align()
		if p.name == "TRAILER!!!" {
			return out
		}
		out = append(out, p)
	}
}

func TestPack(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	for _, d := range []string{"bin", "lib/modules"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "init"), []byte("#!/bin/sh\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "lib/modules/a.ko"), []byte("abcde"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("busybox", filepath.Join(root, "bin/sh")); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "initrd.img")
	t.Setenv("SOURCE_DATE_EPOCH", "")
	if err := run([]string{"-root", root, "-out", out, "-node", "/dev/console:c:5:1:0600"}); err != nil {
		t.Fatal(err)
	}
	first, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if err = run([]string{"-root", root, "-out", out, "-node", "/dev/console:c:5:1:0600"}); err != nil {
		t.Fatal(err)
	}
	second, _ := os.ReadFile(out)
	if !bytes.Equal(first, second) {
		t.Error("output is not deterministic")
	}
	zr, err := gzip.NewReader(bytes.NewReader(first))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	got := parseNewc(t, raw)
	want := []parsed{
		{name: "bin", mode: 0o040755, nlink: 2},
		{name: "bin/sh", mode: 0o120777, nlink: 1, body: "busybox"},
		{name: "dev", mode: 0o040755, nlink: 2},
		{name: "dev/console", mode: 0o020600, nlink: 1, rmajor: 5, rminor: 1},
		{name: "init", mode: 0o100755, nlink: 1, body: "#!/bin/sh\n"},
		{name: "lib", mode: 0o040755, nlink: 2},
		{name: "lib/modules", mode: 0o040755, nlink: 2},
		{name: "lib/modules/a.ko", mode: 0o100644, nlink: 1, body: "abcde"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d entries %+v, want %d", len(got), got, len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("entry %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestBadNode(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"dev/console:c:5:1:0600", "/dev/x:p:1:1:0600", "/dev/x:c:a:1:0600", "/:c:1:1:0600"} {
		if err := run([]string{"-root", dir, "-out", filepath.Join(dir, "o"), "-node", n}); err == nil {
			t.Errorf("-node %q accepted", n)
		}
	}
}
