package atomicfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteReplacesContent(t *testing.T) {
	for _, d := range []Durability{NoSync, SyncData, SyncAll} {
		t.Run(d.String(), func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "f")
			if err := os.WriteFile(p, []byte("old"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := WriteFile(p, []byte("new"), Options{Perm: 0o600, Durability: d}); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(p)
			if err != nil || string(b) != "new" {
				t.Fatalf("content %q, %v", b, err)
			}
			st, err := os.Stat(p)
			if err != nil || st.Mode().Perm() != 0o600 {
				t.Fatalf("mode %v, %v; want 0600", st.Mode(), err)
			}
			assertOnly(t, dir, "f")
		})
	}
}

// A failing fill leaves the target as it was and no temporary file.
func TestWriteFailureKeepsOldContent(t *testing.T) {
	for _, temp := range []string{"", ".f.tmp"} {
		dir := t.TempDir()
		p := filepath.Join(dir, "f")
		if err := os.WriteFile(p, []byte("old"), 0o644); err != nil {
			t.Fatal(err)
		}
		boom := errors.New("boom")
		o := Options{Perm: 0o644, Durability: SyncAll}
		if temp != "" {
			o.Temp = filepath.Join(dir, temp)
		}
		err := Write(p, o, func(w io.Writer) error {
			_, _ = io.WriteString(w, "half")
			return boom
		})
		if !errors.Is(err, boom) || !strings.Contains(err.Error(), p) {
			t.Fatalf("error %v; want boom naming %s", err, p)
		}
		if b, _ := os.ReadFile(p); string(b) != "old" {
			t.Fatalf("target now %q", b)
		}
		assertOnly(t, dir, "f")
	}
}

// A fixed temporary name is used (and a crash's leftover under it is
// overwritten, not appended to).
func TestWriteFixedTemp(t *testing.T) {
	dir := t.TempDir()
	p, tmp := filepath.Join(dir, "state"), filepath.Join(dir, "state.tmp")
	if err := os.WriteFile(tmp, []byte("leftover of a crash, longer than the new content"), 0o600); err != nil {
		t.Fatal(err)
	}
	var seen string
	err := Write(p, Options{Perm: 0o600, Durability: NoSync, Temp: tmp}, func(w io.Writer) error {
		seen = w.(*os.File).Name()
		_, err := io.WriteString(w, "v2")
		return err
	})
	if err != nil || seen != tmp {
		t.Fatalf("wrote through %q, %v; want %s", seen, err, tmp)
	}
	if b, _ := os.ReadFile(p); string(b) != "v2" {
		t.Fatalf("content %q", b)
	}
	assertOnly(t, dir, "state")
}

func TestWriteRefusesUnknownDurability(t *testing.T) {
	dir := t.TempDir()
	if err := WriteFile(filepath.Join(dir, "f"), nil, Options{Durability: 7}); err == nil || !strings.Contains(err.Error(), "durability 7") {
		t.Fatalf("got %v", err)
	}
	assertOnly(t, dir)
}

func assertOnly(t *testing.T, dir string, names ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if strings.Join(got, ",") != strings.Join(names, ",") {
		t.Fatalf("%s holds %v, want %v", dir, got, names)
	}
}
