package docslinks

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// repoRoot is the directory holding go.mod above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// TestRepositoryLinks checks every relative link of every Markdown file of
// the repository.
func TestRepositoryLinks(t *testing.T) {
	root := repoRoot(t)
	errs, err := Check(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range errs {
		t.Error(e)
	}
	files, err := MarkdownFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	// The check must have looked at the pages it exists for.
	for _, want := range []string{"README.md", filepath.Join("docs", "README.md")} {
		found := false
		for _, f := range files {
			found = found || f == want
		}
		if !found {
			t.Errorf("%s not among the Markdown files checked", want)
		}
	}
}

func TestCheckFindsBrokenLinks(t *testing.T) {
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
	write("README.md", strings.Join([]string{
		"# Top",
		"[ok](docs/a.md) [ok anchor](docs/a.md#the-vm-in-the-pods-cgroup) [self](#top)",
		"[gone](docs/gone.md) [bad anchor](docs/a.md#nope) [web](https://example.org/x)",
		"`[in code](nowhere.md)`",
		"```",
		"[fenced](nowhere.md)",
		"```",
		"[dir](docs/) [abs](/etc/passwd)",
	}, "\n"))
	write("docs/a.md", "# A\n\n## The VM in the pod's cgroup\n\n## Twice\n\n## Twice\n\n[back](../README.md#top) [second](#twice-1)\n")
	errs, err := Check(root)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range errs {
		got = append(got, e.Error())
	}
	want := []string{
		"README.md:3: docs/gone.md: no such file or directory",
		"README.md:3: docs/a.md#nope: docs/a.md has no heading #nope",
		"README.md:8: /etc/passwd: absolute path; link relative to the file",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestAnchor(t *testing.T) {
	for h, want := range map[string]string{
		"Resources: the VM in the pod's cgroup":   "resources-the-vm-in-the-pods-cgroup",
		"kvm.containerd.io/disk-images":           "kvmcontainerdiodisk-images",
		"Try it: make demo":                       "try-it-make-demo",
		"containerd 1.6 / 1.7 (config version 2)": "containerd-16--17-config-version-2",
		"One Create, step by step":                "one-create-step-by-step",
	} {
		if got := Anchor(h); got != want {
			t.Errorf("Anchor(%q) = %q, want %q", h, got, want)
		}
	}
}
