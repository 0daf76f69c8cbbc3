package funcsize

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/kvm-shim/containerd-shim-kvm-v1/hack/docslinks"
)

// Func is one function or method declaration of a non-test Go file.
type Func struct {
	File   string // relative to the root, with forward slashes
	Line   int    // of the func keyword
	Name   string // Name, or Recv.Name for a method
	Lines  int    // from the func keyword's line to the closing brace's, both counted
	Params int    // parameters named or listed, the receiver not counted
}

// String names the function as a reader looks for it: file:line name.
func (f Func) String() string {
	return fmt.Sprintf("%s:%d %s", f.File, f.Line, f.Name)
}

// Scan parses every non-test .go file of the packages below root, whatever
// their build tags, and returns its function declarations with their
// sizes, sorted by file and line.
func Scan(root string) ([]Func, error) {
	dirs, err := docslinks.GoPackageDirs(root)
	if err != nil {
		return nil, err
	}
	var funcs []Func
	fset := token.NewFileSet()
	for _, dir := range dirs {
		entries, err := os.ReadDir(filepath.Join(root, dir))
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			name := e.Name()
			if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
				continue
			}
			rel := path.Join(dir, name)
			f, err := parser.ParseFile(fset, filepath.Join(root, rel), nil, parser.SkipObjectResolution)
			if err != nil {
				return nil, fmt.Errorf("parse %s: %w", rel, err)
			}
			funcs = append(funcs, fileFuncs(fset, rel, f)...)
		}
	}
	sort.Slice(funcs, func(i, j int) bool {
		if funcs[i].File != funcs[j].File {
			return funcs[i].File < funcs[j].File
		}
		return funcs[i].Line < funcs[j].Line
	})
	return funcs, nil
}

// fileFuncs measures the function declarations of one parsed file.
func fileFuncs(fset *token.FileSet, rel string, f *ast.File) []Func {
	var funcs []Func
	for _, decl := range f.Decls {
		fd, ok := decl.(*ast.FuncDecl)
		if !ok || fd.Body == nil {
			continue
		}
		start := fset.Position(fd.Pos()).Line
		end := fset.Position(fd.End()).Line
		funcs = append(funcs, Func{
			File:   rel,
			Line:   start,
			Name:   funcName(fd),
			Lines:  end - start + 1,
			Params: countFields(fd.Type.Params),
		})
	}
	return funcs
}

// funcName is a declaration's name, with its receiver's type for a method.
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	t := fd.Recv.List[0].Type
	for {
		switch x := t.(type) {
		case *ast.StarExpr:
			t = x.X
			continue
		case *ast.IndexExpr:
			t = x.X
			continue
		case *ast.IndexListExpr:
			t = x.X
			continue
		case *ast.Ident:
			return x.Name + "." + fd.Name.Name
		}
		return fd.Name.Name
	}
}

// countFields counts a field list's entries: a, b int is two, an unnamed
// int one.
func countFields(fl *ast.FieldList) int {
	if fl == nil {
		return 0
	}
	n := 0
	for _, f := range fl.List {
		if len(f.Names) == 0 {
			n++
			continue
		}
		n += len(f.Names)
	}
	return n
}
