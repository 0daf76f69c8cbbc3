// Command testlogger is a containerd logging binary for the integration
// tests (binary:///path/to/testlogger?file=/path/to/log): built on
// containerd's own logger library, it writes a header line with the
// CONTAINER_ID and CONTAINER_NAMESPACE it was given, then appends every
// chunk it reads from the container's stdout and stderr to the file as it
// comes, and exits once both ended (or on SIGTERM).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/containerd/containerd/runtime/v2/logging"
)

func main() {
	// The shim passes the URI's query as arguments: "file" PATH.
	if len(os.Args) != 3 || os.Args[1] != "file" {
		fmt.Fprintf(os.Stderr, "usage: binary:///path/to/testlogger?file=/path/to/log (got arguments %q)\n", os.Args[1:])
		os.Exit(2)
	}
	path := os.Args[2]
	logging.Run(func(ctx context.Context, cfg *logging.Config, ready func() error) error {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := fmt.Fprintf(f, "testlogger id=%s namespace=%s\n", cfg.ID, cfg.Namespace); err != nil {
			return err
		}
		if err := ready(); err != nil {
			return err
		}
		var mu sync.Mutex // one chunk at a time into the file
		errs := make(chan error, 2)
		for _, r := range []io.Reader{cfg.Stdout, cfg.Stderr} {
			go func() { errs <- copyChunks(f, &mu, r) }()
		}
		var all []error
		for range 2 {
			select {
			case err := <-errs:
				all = append(all, err)
			case <-ctx.Done(): // SIGTERM
				return nil
			}
		}
		return errors.Join(all...)
	})
}

// copyChunks appends what r gives to f, each read at once (no buffering:
// a test polls the file).
func copyChunks(f *os.File, mu *sync.Mutex, r io.Reader) error {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			mu.Lock()
			_, werr := f.Write(buf[:n])
			mu.Unlock()
			if werr != nil {
				return werr
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
