package nodestate

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/containerd/errdefs"
)

// counterChange is a Change of a test state, one decimal number (0 when
// there is no file), that decide maps to its next value.
func counterChange(f *File, decide func(n int) (int, bool)) Change[*int] {
	return Change[*int]{
		Read: func() (*int, error) {
			b, err := f.Read()
			if err != nil {
				return nil, err
			}
			n := 0
			if b != nil {
				if n, err = strconv.Atoi(string(b)); err != nil {
					return nil, f.Corrupt(err)
				}
			}
			return &n, nil
		},
		Decide: func(n *int) (bool, error) {
			var changed bool
			*n, changed = decide(*n)
			return changed, nil
		},
		Write: func(n *int) error {
			return f.Write(func(w io.Writer) error {
				_, err := io.WriteString(w, strconv.Itoa(*n))
				return err
			})
		},
	}
}

func TestApplyWritesOnlyChanges(t *testing.T) {
	dir := t.TempDir()
	f := Open(filepath.Join(dir, "state.json"), "test")
	if b, err := f.Read(); err != nil || b != nil {
		t.Fatalf("Read of a missing state = %q, %v; want nil, nil", b, err)
	}
	if err := Apply(f, counterChange(f, func(n int) (int, bool) { return n + 1, false })); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(f.Path()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("an unchanged state was written: %v", err)
	}
	for range 2 {
		if err := Apply(f, counterChange(f, func(n int) (int, bool) { return n + 1, true })); err != nil {
			t.Fatal(err)
		}
	}
	if b, _ := os.ReadFile(f.Path()); string(b) != "2" {
		t.Errorf("state = %q, want 2", b)
	}
	fi, err := os.Stat(f.Path())
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("state file mode = %v (%v), want 0600", fi, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 { // the state and its lock file, no temporary file
		t.Errorf("dir holds %v, want the state and its lock", entries)
	}
}

func TestApplyCorrupt(t *testing.T) {
	f := Open(filepath.Join(t.TempDir(), "state.json"), "test")
	if err := os.WriteFile(f.Path(), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := Apply(f, counterChange(f, func(n int) (int, bool) { return n + 1, true }))
	if !errors.Is(err, errdefs.ErrDataLoss) {
		t.Fatalf("Apply on a corrupt state = %v, want DataLoss", err)
	}
	c := counterChange(f, func(n int) (int, bool) { return n + 5, true })
	c.Fresh = func() *int { n := 10; return &n }
	if err := Apply(f, c); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(f.Path()); string(b) != "15" {
		t.Errorf("state after replacing a corrupt one = %q, want 15", b)
	}
}

// TestApplyExcludes has goroutines, each with its own lock descriptor as
// separate processes would, add to the state at once: a lost update
// would show the lock does not exclude.
func TestApplyExcludes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	const n = 40
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f := Open(path, "test")
			if err := Apply(f, counterChange(f, func(n int) (int, bool) { return n + 1, true })); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if b, _ := os.ReadFile(path); string(b) != strconv.Itoa(n) {
		t.Errorf("state = %q after %d increments", b, n)
	}
}

func TestErrors(t *testing.T) {
	f := Open("/nonexistent/dir/state.json", "test")
	if err := f.Corrupt("bad"); !errors.Is(err, errdefs.ErrDataLoss) {
		t.Errorf("Corrupt = %v, want DataLoss", err)
	}
	if err := f.CheckVersion(2, 1); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("CheckVersion(2, 1) = %v, want FailedPrecondition", err)
	}
	if err := f.CheckVersion(1, 1); err != nil {
		t.Errorf("CheckVersion(1, 1) = %v", err)
	}
	err := Apply(f, counterChange(f, func(n int) (int, bool) { return n, true }))
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Apply without the state's dir = %v, want not exist", err)
	}
}

func TestReadJSON(t *testing.T) {
	f := Open(filepath.Join(t.TempDir(), "state.json"), "test")
	v := struct{ A, B int }{A: 1}
	if err := f.ReadJSON(&v); err != nil || v.A != 1 {
		t.Fatalf("ReadJSON of a missing state = %+v, %v; want it untouched", v, err)
	}
	if err := os.WriteFile(f.Path(), []byte(`{"B":2}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := f.ReadJSON(&v); err != nil || v.B != 2 {
		t.Fatalf("ReadJSON = %+v, %v; want B 2", v, err)
	}
	if err := os.WriteFile(f.Path(), []byte(`{"B":`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := f.ReadJSON(&v); !errors.Is(err, errdefs.ErrDataLoss) {
		t.Fatalf("ReadJSON of a torn state = %v, want DataLoss", err)
	}
}

func TestHolder(t *testing.T) {
	self, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	if self.Pid != os.Getpid() || !self.Alive() {
		t.Errorf("Self = %+v, alive %v", self, self.Alive())
	}
	if (Holder{Pid: self.Pid, Start: self.Start + 1}).Alive() {
		t.Error("a holder with another start time is alive")
	}
	if (Holder{Pid: 1 << 30, Start: self.Start}).Alive() {
		t.Error("a holder with no process is alive")
	}
}
