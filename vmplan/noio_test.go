package vmplan

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// noIOImports are packages whose use is I/O (files, processes, the
// network, the kernel) or logging: none belongs in a pure translation.
var noIOImports = map[string]bool{
	"os": true, "os/exec": true, "os/user": true, "io/ioutil": true, "io/fs": true,
	"syscall": true, "golang.org/x/sys/unix": true, "net": true, "net/http": true,
	"github.com/containerd/log": true, "github.com/containerd/containerd/mount": true,
}

// noIOCalls are functions of allowed packages that touch the host: the
// file-system walkers of path/filepath, and whatever of vm, numa and
// configdrive reads or changes the host (their types and pure checks are
// fine).
var noIOCalls = map[string]bool{
	"filepath.Abs": true, "filepath.EvalSymlinks": true, "filepath.Glob": true, "filepath.Walk": true, "filepath.WalkDir": true,
	"vm.FindBootSource": true, "vm.OpenInRootfs": true, "vm.Connect": true, "vm.ProbeImage": true,
	"numa.ReadTopology": true, "numa.OpenStore": true, "configdrive.Build": true,
}

// TestNoIO holds the package to its promise: its non-test files import
// nothing that does I/O and call no function that does.
func TestNoIO(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); noIOImports[p] {
				t.Errorf("%s imports %s, which does I/O", fset.Position(imp.Pos()), p)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); ok && noIOCalls[x.Name+"."+sel.Sel.Name] {
				t.Errorf("%s uses %s.%s, which does I/O", fset.Position(sel.Pos()), x.Name, sel.Sel.Name)
			}
			return true
		})
	}
	if checked < 5 {
		t.Fatalf("checked only %d files: is the test in the package's dir?", checked)
	}
}
