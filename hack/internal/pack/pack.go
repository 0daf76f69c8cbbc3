// Package pack holds what the deterministic archive writers hack/ocipack
// and hack/guest/mkcpio share: copying a source file behind a header that
// records its size. (They write their output with internal/atomicfile.)
package pack

import (
	"fmt"
	"io"
	"os"
)

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
