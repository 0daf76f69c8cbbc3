package funcsize

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The house limits for non-test code.
const (
	maxLines  = 80
	maxParams = 5
)

// overLimit are the functions excused from the limits: none since the
// reshaping of issue 23. It must stay empty: a function that needs more
// has to be split or take a struct.
var overLimit = map[string]bool{}

// TestFunctionLimits fails naming every function of the module's non-test
// code that spans more than maxLines lines or takes more than maxParams
// parameters, unless overLimit excuses it; and every overLimit entry that
// no longer needs the excuse, so the list shrinks as the code does.
func TestFunctionLimits(t *testing.T) {
	funcs, err := Scan(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(funcs) < 500 {
		t.Fatalf("found only %d functions: the search is broken", len(funcs))
	}
	excused := map[string]bool{}
	for _, f := range funcs {
		if f.Lines <= maxLines && f.Params <= maxParams {
			continue
		}
		if key := f.File + " " + f.Name; overLimit[key] {
			excused[key] = true
			continue
		}
		if f.Lines > maxLines {
			t.Errorf("%s is %d lines long, more than %d: split it", f, f.Lines, maxLines)
		}
		if f.Params > maxParams {
			t.Errorf("%s takes %d parameters, more than %d: pass a struct", f, f.Params, maxParams)
		}
	}
	for key := range overLimit {
		if !excused[key] {
			t.Errorf("%s is within the limits now (or gone): remove it from overLimit", key)
		}
	}
}

// TestScanMeasures checks the measuring on a file whose sizes are known.
func TestScanMeasures(t *testing.T) {
	root := t.TempDir()
	src := "package p\n\n" +
		"func a(x, y int, _ string, f func(int) int) {\n}\n\n" + // lines 3-4, 4 params
		"type T struct{}\n\n" +
		"func (t *T) b() int {\n\tx := 1\n\n\treturn x\n}\n\n" + // lines 8-12
		"func short() {}\n"
	for name, text := range map[string]string{
		"p/p.go":      src,
		"p/p_test.go": "package p\n\nfunc long(a, b, c, d, e, f, g int) {}\n",
		"go.mod":      "module m\n",
	} {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	funcs, err := Scan(root)
	if err != nil {
		t.Fatal(err)
	}
	want := []Func{
		{File: "p/p.go", Line: 3, Name: "a", Lines: 2, Params: 4},
		{File: "p/p.go", Line: 8, Name: "T.b", Lines: 5, Params: 0},
		{File: "p/p.go", Line: 14, Name: "short", Lines: 1, Params: 0},
	}
	if len(funcs) != len(want) {
		t.Fatalf("Scan = %v, want %v", funcs, want)
	}
	for i := range want {
		if funcs[i] != want[i] {
			t.Errorf("Scan[%d] = %+v, want %+v", i, funcs[i], want[i])
		}
	}
}

// repoRoot is the directory holding go.mod above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for !strings.HasSuffix(dir, string(filepath.Separator)) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		dir = filepath.Dir(dir)
	}
	t.Fatal("no go.mod above the test's directory")
	return ""
}
