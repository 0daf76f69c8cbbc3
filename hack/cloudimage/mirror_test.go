package cloudimage

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// aptMirror runs hack/lib/apt-mirror.sh's apt_mirror for suite against an
// apt directory holding files (name relative to the directory -> content).
func aptMirror(t *testing.T, suite string, files map[string]string) (string, error) {
	t.Helper()
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "sources.list.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	lib := filepath.Join(repoRoot(t), "hack", "lib", "apt-mirror.sh")
	// The arguments reach the script as positional parameters, not as code.
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", `source "$1"; apt_mirror "$2" "$3"`, "bash", lib, suite, dir)
	out, err := cmd.Output()
	return strings.TrimSpace(string(out)), err
}

// debianSources is a Debian 12 default deb822 file: the archive and its
// security suite.
const debianSources = `Types: deb
# http://snapshot.example/archive/debian/20250520T000000Z
URIs: http://mirror-a.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror-a.example/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
`

func TestAptMirror(t *testing.T) {
	for _, tc := range []struct {
		name  string
		suite string // default bookworm
		files map[string]string
		want  string // "" means none: apt_mirror fails and prints nothing
	}{
		{
			name:  "deb822 default",
			files: map[string]string{"sources.list.d/debian.sources": debianSources},
			want:  "http://mirror-a.example/debian",
		},
		{
			name:  "the security suite",
			suite: "bookworm-security",
			files: map[string]string{"sources.list.d/debian.sources": debianSources},
			want:  "http://mirror-a.example/debian-security",
		},
		{
			name:  "a suite the host does not have",
			suite: "trixie",
			files: map[string]string{"sources.list.d/debian.sources": debianSources},
			want:  "",
		},
		{
			name: "one-line with options, comments and a trailing slash",
			files: map[string]string{"sources.list": `# deb http://commented.example/debian bookworm main
deb-src http://src.example/debian bookworm main
deb [ arch=amd64 signed-by=/usr/share/keyrings/k.gpg ] http://mirror-b.example/debian/ bookworm main contrib # the archive
`},
			want: "http://mirror-b.example/debian",
		},
		{
			name: "one-line: other suite, no main, then the match",
			files: map[string]string{"sources.list": `deb http://mirror-c.example/debian bookworm-updates main
deb http://mirror-c.example/debian bookworm contrib non-free
deb https://mirror-d.example/debian bookworm non-free-firmware main
`},
			want: "https://mirror-d.example/debian",
		},
		{
			name: "deb822: disabled, deb-src only and folded URIs",
			files: map[string]string{"sources.list.d/a.sources": `Types: deb
URIs: http://disabled.example/debian
Suites: bookworm
Components: main
Enabled: no

types: deb-src
uris: http://src.example/debian
suites: bookworm
components: main

Types: deb deb-src
URIs:
 cdrom:/media/cdrom/
 http://mirror-e.example/debian
Suites: bookworm
Components: contrib main
`},
			want: "http://mirror-e.example/debian",
		},
		{
			name: "sources.list before sources.list.d, which sorts by name",
			files: map[string]string{
				"sources.list":                "deb http://first.example/debian bookworm main\n",
				"sources.list.d/a.sources":    "Types: deb\nURIs: http://second.example/debian\nSuites: bookworm\nComponents: main\n",
				"sources.list.d/b.list":       "deb http://third.example/debian bookworm main\n",
				"sources.list.d/c.list.saved": "deb http://ignored.example/debian bookworm main\n",
			},
			want: "http://first.example/debian",
		},
		{
			name: "only sources.list.d, sorted across both formats",
			files: map[string]string{
				"sources.list.d/b.sources": "Types: deb\nURIs: http://second.example/debian\nSuites: bookworm\nComponents: main\n",
				"sources.list.d/a.list":    "deb http://first.example/debian bookworm main\n",
			},
			want: "http://first.example/debian",
		},
		{
			name: "files apt ignores and a non-http method",
			files: map[string]string{
				"sources.list":                       "deb mirror+file:/etc/apt/mirrors.txt bookworm main\n",
				"sources.list.d/x.list.disabled":     "deb http://ignored.example/debian bookworm main\n",
				"sources.list.d/y.sources.dpkg-dist": "Types: deb\nURIs: http://ignored.example/debian\nSuites: bookworm\nComponents: main\n",
			},
			want: "",
		},
		{
			name:  "no sources at all",
			files: map[string]string{},
			want:  "",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			suite := tc.suite
			if suite == "" {
				suite = "bookworm"
			}
			got, err := aptMirror(t, suite, tc.files)
			if tc.want == "" {
				if err == nil || got != "" {
					t.Fatalf("apt_mirror %s = %q, %v; want no output and a failure", suite, got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("apt_mirror %s = %q, %v; want %q", suite, got, err, tc.want)
			}
		})
	}
}
