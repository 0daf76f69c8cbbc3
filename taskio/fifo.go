package taskio

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"time"
)

// StallTimeout is how long output waits for a full FIFOStream FIFO
// before it is dropped.
const StallTimeout = time.Second

// streamFIFO writes to containerd's stdout FIFO. It holds a read end of
// its own (never read), as runc's shim does, so a write never fails with
// EPIPE while containerd is away: when containerd restarts, it reopens
// the FIFO and the output goes on reaching the container log.
// Meanwhile the FIFO fills; a write that waits StallTimeout for room is
// dropped, and further writes are dropped at once until one fits again,
// so the writer is never held by a reader that is gone.
type streamFIFO struct {
	r, w     *os.File
	dropping bool         // used by Write only
	dropped  atomic.Int64 // bytes of output dropped since open
}

func openStreamFIFO(path string) (*streamFIFO, error) {
	r, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	st, err := r.Stat()
	if err == nil && st.Mode()&os.ModeNamedPipe == 0 {
		err = fmt.Errorf("%s is not a FIFO", path)
	}
	var w *os.File
	if err == nil {
		w, err = os.OpenFile(path, os.O_WRONLY, 0) // returns at once: a reader (r) is there
	}
	if err != nil {
		r.Close()
		return nil, err
	}
	return &streamFIFO{r: r, w: w}, nil
}

func (f *streamFIFO) Write(b []byte) (int, error) {
	deadline := time.Now().Add(StallTimeout)
	if f.dropping {
		// Room now or never. (A deadline already past would fail the
		// write before it is tried.)
		deadline = time.Now().Add(time.Millisecond)
	}
	if err := f.w.SetWriteDeadline(deadline); err != nil {
		return 0, err
	}
	n, err := f.w.Write(b)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		f.dropping = true
		f.dropped.Add(int64(len(b) - n))
		return len(b), nil
	}
	f.dropping = false
	return n, err
}

func (f *streamFIFO) Close() error {
	return errors.Join(f.w.Close(), f.r.Close())
}
