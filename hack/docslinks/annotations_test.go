package docslinks

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAnnotationReference keeps docs/annotations.md complete and current:
// every kvm.containerd.io/* key that a Go file names has a section there,
// and every section names a key the code still reads.
func TestAnnotationReference(t *testing.T) {
	root := repoRoot(t)
	code, err := CodeAnnotationKeys(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(code) == 0 {
		t.Fatal("found no annotation keys in the code: the search is broken")
	}
	documented, err := DocumentedAnnotationKeys(filepath.Join(root, "docs", "annotations.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := map[string]bool{}
	for _, k := range documented {
		doc[k] = true
		if _, ok := code[k]; !ok {
			t.Errorf("docs/annotations.md documents %s%s, which no Go file names", AnnotationPrefix, k)
		}
	}
	for k, files := range code {
		if !doc[k] {
			t.Errorf("%s%s (named in %v) has no section in docs/annotations.md", AnnotationPrefix, k, files)
		}
	}
}

// TestNodeLabelReference: every node label of the prefix is named in
// the code and documented on its page.
func TestNodeLabelReference(t *testing.T) {
	root := repoRoot(t)
	var code []byte
	if err := walkFiles(root, func(rel string) error {
		if strings.HasSuffix(rel, ".go") && !strings.HasSuffix(rel, "_test.go") {
			b, err := os.ReadFile(filepath.Join(root, rel))
			code = append(code, b...)
			return err
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for k, page := range NodeLabels {
		if !bytes.Contains(code, []byte(`"`+AnnotationPrefix+k+`"`)) {
			t.Errorf("node label %s%s: no Go file names it", AnnotationPrefix, k)
		}
		b, err := os.ReadFile(filepath.Join(root, page))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(b, []byte(AnnotationPrefix+k)) {
			t.Errorf("node label %s%s is not documented in %s", AnnotationPrefix, k, page)
		}
	}
}

func TestAnnotationKeySearch(t *testing.T) {
	root := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a/a.go", "package a\nconst (\n\tAnnotationPrefix = \"kvm.containerd.io/\"\n"+
		"\tX = AnnotationPrefix + \"user-data\"\n\tY = \"kvm.containerd.io/vcpus\"\n\tZ = \"kvm.containerd.io/*\"\n)\n")
	write("a/a_test.go", "package a\nconst T = \"kvm.containerd.io/only-in-a-test\"\n")
	write("docs/annotations.md", "# A\n\n### kvm.containerd.io/vcpus\n\n"+
		"### `kvm.containerd.io/user-data`\n\nkvm.containerd.io/memory in prose\n")
	code, err := CodeAnnotationKeys(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(code) != 2 || len(code["user-data"]) != 1 || len(code["vcpus"]) != 1 {
		t.Errorf("code keys = %v, want user-data and vcpus, each in a/a.go", code)
	}
	doc, err := DocumentedAnnotationKeys(filepath.Join(root, "docs", "annotations.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(doc) != 2 || doc[0] != "user-data" || doc[1] != "vcpus" {
		t.Errorf("documented keys = %v, want [user-data vcpus]", doc)
	}
}
