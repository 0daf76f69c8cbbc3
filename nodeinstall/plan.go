package nodeinstall

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
)

// defaultDropinDir is what containerd 2.x imports when it has no
// config.toml.
const defaultDropinDir = "/etc/containerd/conf.d"

// planConfig works out the containerd configuration files the runtime
// needs for config version v. It reads only: a refusal changes nothing.
func (l Layout) planConfig(v ConfigVersion) ([]configFile, error) {
	switch v {
	case 2:
		f, err := l.planV2()
		if err != nil {
			return nil, err
		}
		return []configFile{f}, nil
	case 3:
		return l.planV3()
	}
	return nil, fmt.Errorf("containerd config version %d: %w", v, errdefs.ErrNotImplemented)
}

// planV2 adds the runtime to config.toml itself, between marks:
// containerd 1.6 and 1.7 replace a whole plugin section with an imported
// file's, so a drop-in would take every other CRI setting away
// (docs/install.md says what was measured).
func (l Layout) planV2() (configFile, error) {
	path := l.ContainerdConfig
	have, exists, err := readOptional(l.host(path))
	if err != nil {
		return configFile{}, err
	}
	f := configFile{path: path, have: have, haveExists: exists}
	base := []byte("version = 2\n")
	if exists {
		if _, perr := parseConfig(path, have); perr != nil {
			return f, perr
		}
		base, _ = stripMarked(have)
		if len(base) > 0 && base[len(base)-1] != '\n' {
			base = append(base, '\n')
		}
	}
	m, err := parseConfig(path, base)
	if err != nil {
		return f, err
	}
	if v := configVersion(m); v != 2 {
		return f, fmt.Errorf("containerd config %s is version %d; containerd 1.6/1.7 need version 2 here "+
			"(`containerd config migrate` converts a version 1 file), nothing changed: %w", path, v, errdefs.ErrFailedPrecondition)
	}
	if declaresRuntime(m, 2, "kvm") {
		return f, foreignRuntime(path)
	}
	var block strings.Builder
	if !declaresRuntime(m, 2, "runc") {
		// 1.x's CRI refuses a config with a kvm runtime and no runc one.
		runc, rerr := l.payloadSnippet("containerd-v2-runc.toml")
		if rerr != nil {
			return f, rerr
		}
		t := tables(runc)
		if _, ok := lookup(m, "plugins", "io.containerd.grpc.v1.cri", "containerd"); ok {
			// That table exists already: TOML forbids a second header;
			// default_runtime_name is runc by default.
			t = t[strings.Index(t, "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]"):]
		}
		block.WriteString(t)
	}
	kvm, err := l.payloadSnippet("containerd-v2.toml")
	if err != nil {
		return f, err
	}
	block.WriteString(tables(kvm))
	f.want = append(append([]byte{}, base...), marked(block.String())...)
	return f, l.verify(f.path, f.want, 2)
}

// planV3 writes deploy/deb's version 3 drop-in into DropinDir, which
// containerd 2.x merges key by key, and makes config.toml import that
// directory when it does not (one marked line at its top).
func (l Layout) planV3() ([]configFile, error) {
	snippet, err := l.payloadSnippet("containerd-v3.toml")
	if err != nil {
		return nil, err
	}
	dropin := configFile{path: l.DropinPath(), want: snippet}
	if dropin.have, dropin.haveExists, err = readOptional(l.host(dropin.path)); err != nil {
		return nil, err
	}
	path := l.ContainerdConfig
	have, exists, err := readOptional(l.host(path))
	if err != nil {
		return nil, err
	}
	main := configFile{path: path, have: have, haveExists: exists, want: have}
	if !exists {
		if l.DropinDir != defaultDropinDir {
			return nil, fmt.Errorf("no containerd config %s: containerd 2.x then imports %s only, not the drop-in dir %s: %w",
				path, defaultDropinDir, l.DropinDir, errdefs.ErrFailedPrecondition)
		}
		return []configFile{dropin}, nil
	}
	if _, perr := parseConfig(path, have); perr != nil {
		return nil, perr
	}
	base, _ := stripMarked(have)
	m, err := parseConfig(path, base)
	if err != nil {
		return nil, err
	}
	if v := configVersion(m); v != 3 {
		return nil, fmt.Errorf("containerd config %s is version %d; with containerd 2.x the installer needs version 3 "+
			"(`containerd config migrate`), nothing changed: %w", path, v, errdefs.ErrFailedPrecondition)
	}
	if declaresRuntime(m, 3, "kvm") {
		return nil, foreignRuntime(path)
	}
	imports, hasImports := m["imports"]
	switch {
	case importsPath(imports, dropin.path):
		main.want = base
	case !hasImports:
		line := "imports = [" + strconv.Quote(filepath.Join(l.DropinDir, "*.toml")) + "]"
		main.want = append(marked(line), base...)
	default:
		return nil, fmt.Errorf("containerd config %s has imports %v without %s; add %q to them, nothing changed: %w",
			path, imports, dropin.path, filepath.Join(l.DropinDir, "*.toml"), errdefs.ErrFailedPrecondition)
	}
	if err := l.verify(path, main.want, 3); err != nil {
		return nil, err
	}
	return []configFile{dropin, main}, nil
}

// importsPath reports whether an imports array names path or a glob
// matching it.
func importsPath(imports any, path string) bool {
	list, _ := imports.([]any)
	for _, x := range list {
		if s, ok := x.(string); ok {
			if ok, _ := filepath.Match(s, path); ok || s == path {
				return true
			}
		}
	}
	return false
}

// verify parses what the installer is about to write: its own lines
// must leave a config containerd can read.
func (l Layout) verify(path string, b []byte, v int64) error {
	m, err := parseConfig(path, b)
	if err != nil {
		return fmt.Errorf("the installer's lines would break %s: %w", path, err)
	}
	if got := configVersion(m); got != v {
		return fmt.Errorf("the installer's lines would make %s version %d: %w", path, got, errdefs.ErrInvalidArgument)
	}
	return nil
}

func foreignRuntime(path string) error {
	return fmt.Errorf("containerd config %s declares a kvm runtime the installer did not write; remove it first, nothing changed: %w",
		path, errdefs.ErrAlreadyExists)
}
