package annotations

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// The reference in docs/ is what WriteReference makes of the package:
// `go generate ./annotations` after a change here.
func TestReferenceIsGenerated(t *testing.T) {
	var b bytes.Buffer
	if err := WriteReference(&b); err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile("../docs/annotations.md")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(page, b.Bytes()) {
		t.Fatal("docs/annotations.md differs from package annotations: run go generate ./annotations")
	}
}

// Every key is under Prefix, described once, with a value, a default and
// a section.
func TestReferenceKeys(t *testing.T) {
	seen := map[string]bool{}
	for _, g := range Reference {
		if g.Title == "" || len(g.Keys) == 0 {
			t.Errorf("group %q: no title or no keys", g.Title)
		}
		for _, k := range g.Keys {
			if !strings.HasPrefix(k.Name, Prefix) || len(k.Name) == len(Prefix) {
				t.Errorf("key %q is not under %s", k.Name, Prefix)
			}
			if seen[k.Name] {
				t.Errorf("key %s is described twice", k.Name)
			}
			seen[k.Name] = true
			if k.Value == "" || k.Default == "" || k.Doc == "" {
				t.Errorf("key %s lacks its value, default or section", k.Name)
			}
		}
	}
	for _, k := range []string{VCPUs, Memory, KernelCmdline, NUMAMode, MaxVCPUs, MaxMemoryMiB, DiskImages,
		UserData, UserDataBase64, SSHAuthorizedKeys, Metadata, ConfigDriveFormat, ConfigDrive} {
		if !seen[k] {
			t.Errorf("key %s has no entry in Reference", k)
		}
	}
	if len(seen) != 13 {
		t.Errorf("%d keys described, want the 13 constants", len(seen))
	}
}
