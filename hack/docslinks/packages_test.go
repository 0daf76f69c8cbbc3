package docslinks

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPackageMap keeps the package map in docs/README.md complete: every
// directory with Go files has a row naming it as `dir`.
func TestPackageMap(t *testing.T) {
	root := repoRoot(t)
	dirs, err := GoPackageDirs(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 10 {
		t.Fatalf("found only %v: the search is broken", dirs)
	}
	b, err := os.ReadFile(filepath.Join(root, "docs", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	for _, d := range dirs {
		if !strings.Contains(page, "| `"+d+"`") && !strings.Contains(page, "| `"+d+"/`") {
			t.Errorf("package %s has no row in the package map of docs/README.md", d)
		}
	}
}
