package nodeinstall

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"

	"github.com/containerd/errdefs"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/atomicfile"
)

// placeFile makes the node's path hold data with mode perm: unchanged
// when it does already, else a temporary file beside it, synced, renamed
// over it. A running shim keeps the file it was started from (rename
// replaces the name, not the inode); the next shim started gets the new
// one. It reports whether it wrote.
func (l Layout) placeFile(path string, data []byte, perm os.FileMode) (bool, error) {
	p := l.host(path)
	if have, err := os.ReadFile(p); err == nil && bytes.Equal(have, data) {
		if fi, err := os.Stat(p); err == nil && fi.Mode().Perm() == perm {
			return false, nil
		}
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return false, err
	}
	return true, atomicfile.WriteFile(p, data, atomicfile.Options{Perm: perm, Durability: atomicfile.SyncAll})
}

// payload is what the installer's image carries for the node.
type payload struct {
	shim, wrapper, shimConfig []byte
}

var wrapperLine = regexp.MustCompile(`(?m)^qemu_wrapper = .*$`)

// readPayload reads the binaries and the default config, pointing its
// qemu_wrapper at where the wrapper goes on the node.
func (l Layout) readPayload() (*payload, error) {
	var p payload
	for _, f := range []struct {
		dst  *[]byte
		path string
	}{
		{&p.shim, filepath.Join(l.Payload, "bin", ShimName)},
		{&p.wrapper, filepath.Join(l.Payload, "bin", WrapperName)},
		{&p.shimConfig, filepath.Join(l.Payload, "config.toml")},
	} {
		b, err := os.ReadFile(f.path)
		if err != nil {
			return nil, fmt.Errorf("installer payload: %w", err)
		}
		*f.dst = b
	}
	if !wrapperLine.Match(p.shimConfig) {
		return nil, fmt.Errorf("installer payload config.toml has no qemu_wrapper line: %w", errdefs.ErrInvalidArgument)
	}
	p.shimConfig = wrapperLine.ReplaceAll(p.shimConfig, []byte("qemu_wrapper = "+strconv.Quote(l.WrapperPath())))
	return &p, nil
}

// installFiles places the binaries and, when absent or still the one the
// installer wrote, the shim config. It returns the node paths written.
func (l Layout) installFiles(p *payload, rec *record) ([]string, error) {
	var wrote []string
	for _, f := range []struct {
		path string
		data []byte
	}{
		// The wrapper first: a shim of the new version may need it.
		{l.WrapperPath(), p.wrapper},
		{l.ShimPath(), p.shim},
	} {
		w, err := l.placeFile(f.path, f.data, 0o755)
		if err != nil {
			return wrote, err
		}
		rec.Written[f.path] = digest(f.data)
		if w {
			wrote = append(wrote, f.path)
		}
	}
	have, exists, err := readOptional(l.host(l.ShimConfig))
	if err != nil {
		return wrote, err
	}
	ours := exists && rec.Written[l.ShimConfig] == digest(have)
	if exists && !ours {
		return wrote, nil // the operator's: kept
	}
	if !exists {
		rec.ShimConfigCreated = true
	}
	w, err := l.placeFile(l.ShimConfig, p.shimConfig, 0o644)
	if err != nil {
		return wrote, err
	}
	rec.Written[l.ShimConfig] = digest(p.shimConfig)
	if w {
		wrote = append(wrote, l.ShimConfig)
	}
	return wrote, nil
}

// removeFiles takes the binaries away, and the shim config when the
// installer created it and nobody changed it since. A running shim keeps
// its binary (unlinked, not overwritten).
func (l Layout) removeFiles(rec *record) error {
	var errs []error
	paths := []string{l.ShimPath(), l.WrapperPath()}
	if rec.ShimConfigCreated {
		paths = append(paths, l.ShimConfig)
	}
	for _, path := range paths {
		have, exists, err := readOptional(l.host(path))
		if err != nil || !exists {
			errs = append(errs, err)
			continue
		}
		if digest(have) != rec.Written[path] {
			continue // not the installer's any more
		}
		errs = append(errs, os.Remove(l.host(path)))
	}
	for _, dir := range []string{filepath.Dir(l.WrapperPath()), filepath.Dir(l.ShimConfig)} {
		if err := os.Remove(l.host(dir)); err != nil && !errors.Is(err, os.ErrNotExist) && !isNotEmpty(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func isNotEmpty(err error) bool {
	var pe *os.PathError
	return errors.As(err, &pe) && (errors.Is(pe.Err, errNotEmpty) || errors.Is(pe.Err, errExist))
}
