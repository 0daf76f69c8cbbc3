package nodeinstall

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/pelletier/go-toml/v2"
)

// ConfigVersion is the containerd configuration format a containerd
// reads: 2 for containerd 1.6 and 1.7, 3 for 2.x.
type ConfigVersion int

var versionRE = regexp.MustCompile(`^(?:containerd://)?v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+~].*)?$`)

// ConfigVersionOf maps a containerd version ("1.6.20", "v2.2.1", or
// kubelet's "containerd://1.7.0") to the config version the installer
// writes; a version it was not tested with is refused.
func ConfigVersionOf(v string) (ConfigVersion, error) {
	m := versionRE.FindStringSubmatch(strings.TrimSpace(v))
	if m == nil {
		return 0, fmt.Errorf("containerd version %q: not containerd://MAJOR.MINOR[.PATCH]: %w", v, errdefs.ErrInvalidArgument)
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	switch {
	case major == 1 && (minor == 6 || minor == 7):
		return 2, nil
	case major == 2:
		return 3, nil
	}
	return 0, fmt.Errorf("containerd %d.%d is not supported (1.6, 1.7 and 2.x are): %w", major, minor, errdefs.ErrNotImplemented)
}

// The marks around what the installer adds to a config.toml: they let a
// re-run or an upgrade find and replace its own lines.
const (
	markBegin = "# BEGIN " + ShimName + " node installer: removed on uninstall"
	markEnd   = "# END " + ShimName + " node installer"
)

// stripMarked returns b without the installer's marked regions.
func stripMarked(b []byte) ([]byte, bool) {
	var out []byte
	found, in := false, false
	for _, line := range bytes.SplitAfter(b, []byte("\n")) {
		t := string(bytes.TrimRight(line, "\r\n"))
		switch {
		case t == markBegin:
			in, found = true, true
		case t == markEnd && in:
			in = false
		case !in:
			out = append(out, line...)
		}
	}
	return out, found
}

func marked(lines string) []byte {
	return []byte(markBegin + "\n" + strings.TrimRight(lines, "\n") + "\n" + markEnd + "\n")
}

// tables returns a snippet from its first table header on: deploy/deb's
// files open with comments addressed to a person installing by hand.
func tables(snippet []byte) string {
	for i, line := range strings.SplitAfter(string(snippet), "\n") {
		if strings.HasPrefix(line, "[") {
			return strings.Join(strings.SplitAfter(string(snippet), "\n")[i:], "")
		}
	}
	return ""
}

// configFile is one containerd configuration file as it is and as the
// installer wants it; want nil means the file should not exist.
type configFile struct {
	path       string // on the node
	have, want []byte
	haveExists bool
}

func (c configFile) changed() bool {
	return c.haveExists != (c.want != nil) || !bytes.Equal(c.have, c.want)
}

func readOptional(path string) ([]byte, bool, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return b, true, nil
}

// parseConfig decodes a containerd config; a file that is not TOML is
// refused with the parser's position.
func parseConfig(path string, b []byte) (map[string]any, error) {
	m := map[string]any{}
	if err := toml.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("containerd config %s cannot be parsed, nothing changed: %w", path, errors.Join(err, errdefs.ErrInvalidArgument))
	}
	return m, nil
}

func configVersion(m map[string]any) int64 {
	v, _ := m["version"].(int64)
	return v
}

// lookup follows keys through nested tables.
func lookup(m map[string]any, keys ...string) (any, bool) {
	var cur any = m
	for _, k := range keys {
		t, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = t[k]; !ok {
			return nil, false
		}
	}
	return cur, true
}

// criRuntimes are the keys of the CRI runtimes table in each version.
var criRuntimes = map[ConfigVersion][]string{
	2: {"plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes"},
	3: {"plugins", "io.containerd.cri.v1.runtime", "containerd", "runtimes"},
}

func declaresRuntime(m map[string]any, v ConfigVersion, name string) bool {
	_, ok := lookup(m, append(append([]string{}, criRuntimes[v]...), name)...)
	return ok
}

var configPathLine = regexp.MustCompile(`(?m)^(\s*ConfigPath = ).*$`)

// payloadSnippet reads one of deploy/deb's containerd snippets from the
// payload, with the runtime's ConfigPath set to where the shim config is.
func (l Layout) payloadSnippet(name string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(l.Payload, "containerd", name))
	if err != nil {
		return nil, fmt.Errorf("installer payload: %w", err)
	}
	return configPathLine.ReplaceAll(b, []byte("${1}"+strconv.Quote(l.ShimConfig))), nil
}
