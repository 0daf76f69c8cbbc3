// Package atomicfile replaces a file's content in one step: it writes a
// temporary file beside the target and renames it over the target, so a
// reader, or a process that starts after a crash, finds the old content
// or the new one and never a torn file. How much survives a power loss
// is the caller's choice, stated with a Durability at every call.
package atomicfile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Durability says what survives a power loss (or a kernel crash) once a
// write returned. A crash of the writing process alone is covered by the
// rename at every level.
type Durability int

const (
	// NoSync flushes nothing: after a power loss the target may hold the
	// old content, the new one, or (on some file systems) be empty. For
	// files that are rebuilt anyway (build outputs) or live on a tmpfs.
	NoSync Durability = iota
	// SyncData flushes the new file's data before the rename, so the
	// target never names a file whose data was lost; the rename itself
	// may be lost (the old content comes back) unless the caller syncs
	// the directory later.
	SyncData
	// SyncAll also flushes the directory after the rename: once Write
	// returns, the new content survives a power loss.
	SyncAll
)

func (d Durability) String() string {
	switch d {
	case NoSync:
		return "no sync"
	case SyncData:
		return "sync data"
	case SyncAll:
		return "sync data and directory"
	}
	return fmt.Sprintf("durability(%d)", int(d))
}

// Options of a write. Durability has no default on purpose: the zero
// value is NoSync, and every caller names the one it needs.
type Options struct {
	Perm       os.FileMode
	Durability Durability
	// Temp is the temporary file's fixed path, for a caller that holds a
	// lock making that name its own (a crash's leftover is then simply
	// overwritten next time). Empty: a unique name beside the target,
	// starting with "." and the target's base name.
	Temp string
}

// WriteFile replaces path's content with data.
func WriteFile(path string, data []byte, o Options) error {
	return Write(path, o, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// Write replaces path's content with what fill writes. On any error the
// temporary file is removed and path is left as it was.
func Write(path string, o Options, fill func(w io.Writer) error) (retErr error) {
	if o.Durability < NoSync || o.Durability > SyncAll {
		return fmt.Errorf("write %s: unknown durability %d", path, int(o.Durability))
	}
	var f *os.File
	var err error
	if o.Temp != "" {
		f, err = os.OpenFile(o.Temp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, o.Perm)
	} else {
		f, err = os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if retErr != nil {
			_ = f.Close() // a second close only errors
			_ = os.Remove(tmp)
			retErr = fmt.Errorf("write %s: %w", path, retErr)
		}
	}()
	if err := fill(f); err != nil {
		return err
	}
	// CreateTemp makes 0600 and OpenFile's mode is masked by the umask:
	// the target gets exactly Perm.
	if err := f.Chmod(o.Perm); err != nil {
		return err
	}
	if o.Durability >= SyncData {
		if err := f.Sync(); err != nil {
			return err
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	if o.Durability == SyncAll {
		// The content is in place; a failed directory sync is reported,
		// but the target is not rolled back.
		if err := SyncDir(filepath.Dir(path)); err != nil {
			return errors.Join(err, errRenamed)
		}
	}
	return nil
}

// errRenamed marks a failure after the rename: the new content is in
// place but may not survive a power loss.
var errRenamed = errors.New("the new content is in place but its directory was not synced")

// SyncDir flushes the directory dir, making renames and creations in it
// survive a power loss.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
