package check

import (
	"os"
	"path/filepath"
	"testing"
)

// TestRuntimeRegisteredFollowsImports: the runtime may be declared in the
// main config or in a file its imports name (the Debian package's drop-in
// on containerd 2.x); a config that imports nothing with it has none.
func TestRuntimeRegisteredFollowsImports(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	dropIn := "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.kvm]\n  runtime_type = \"io.containerd.kvm.v1\"\n"
	write("conf.d/kvm.toml", dropIn)
	write("other.d/runc.toml", "version = 3\n")
	cases := []struct {
		name, config string
		want         bool
	}{
		{"inline", dropIn, true},
		{"absolute glob", "version = 3\nimports = [\"" + dir + "/conf.d/*.toml\"]\n", true},
		{"relative glob", "version = 3\nimports = [\"conf.d/*.toml\"]\n", true},
		{"imports without it", "version = 3\nimports = [\"other.d/*.toml\"]\n", false},
		{"no imports", "version = 2\n", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := runtimeRegistered(write("config.toml", c.config))
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Fatalf("runtimeRegistered = %v, want %v", got, c.want)
			}
		})
	}
	loop := write("loop.toml", "version = 2\nimports = [\""+filepath.Join(dir, "loop.toml")+"\"]\n")
	if got, err := runtimeRegistered(loop); err != nil || got {
		t.Fatalf("a config importing itself: %v, %v; want false, nil", got, err)
	}
}
