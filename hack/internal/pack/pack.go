// Package pack holds what the deterministic archive writers hack/ocipack
// and hack/guest/mkcpio share: writing the output file atomically, and
// copying a source file behind a header that records its size.
package pack

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// WriteFile creates a temporary file in path's directory, named after
// pattern as by os.CreateTemp, lets write fill it and, once write succeeds,
// gives it mode perm and renames it to path. On any error the temporary
// file is removed and path is left as it was: the build scripts take an
// output's existence and mtime for "up to date", so an interrupted build
// must not leave half an archive.
func WriteFile(path, pattern string, perm os.FileMode, write func(w io.Writer) error) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), pattern)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err = write(tmp); err != nil {
		return err
	}
	if err = tmp.Chmod(perm); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// CopyFile writes the regular file src to w behind a header: it opens src,
// calls header with its size, then copies exactly that many bytes, so that
// the data always matches the size the header recorded.
func CopyFile(w io.Writer, src string, header func(size int64) error) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s: not a regular file", src)
	}
	if err := header(st.Size()); err != nil {
		return err
	}
	if _, err := io.CopyN(w, f, st.Size()); err != nil {
		return fmt.Errorf("%s: %w (did it change while being read?)", src, err)
	}
	return nil
}
