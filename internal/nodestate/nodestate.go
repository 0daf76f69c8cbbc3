package nodestate

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/atomicfile"
	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/procfs"
)

// Holder is a process that took something libvirt may not know yet. Pid
// with its start time (clock ticks since boot, /proc/<pid>/stat field 22)
// survives pid reuse.
type Holder struct {
	Pid   int    `json:"pid"`
	Start uint64 `json:"start"`
}

// Self is the calling process as a Holder.
func Self() (Holder, error) {
	pid := os.Getpid()
	start, err := procfs.StartTime(pid)
	if err != nil {
		return Holder{}, err
	}
	return Holder{Pid: pid, Start: start}, nil
}

// Alive reports whether h still runs and is the same process (same start
// time). When /proc cannot tell, the holder counts as alive: a leaked
// reservation is better than one resource handed out twice.
func (h Holder) Alive() bool { return !procfs.Gone(h.Pid, h.Start) }

// File is one node-wide state file. It holds no open descriptor between
// calls and is safe for concurrent use by goroutines and processes.
type File struct {
	path, lockPath, tmpPath string
	// what names the state in errors: "NUMA", "id".
	what string
	// volatile: the file lives on a tmpfs (or ramfs), where fsync does
	// nothing but cost system calls; rename alone keeps every reader
	// seeing the old or the new file.
	volatile bool
}

// Open returns the state file at path, named what in errors. It touches
// no file: the directory of path must exist when the state is first
// changed, and a missing file is an empty state.
func Open(path, what string) *File {
	return &File{path: path, lockPath: path + ".lock", tmpPath: path + ".tmp", what: what,
		volatile: inMemoryFS(filepath.Dir(path))}
}

// Path is the state file's path.
func (f *File) Path() string { return f.path }

// inMemoryFS reports whether dir is on a tmpfs or ramfs.
func inMemoryFS(dir string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false
	}
	return st.Type == unix.TMPFS_MAGIC || st.Type == unix.RAMFS_MAGIC
}

// Change is one read, decision and write of a state of type S, made with
// the lock held (Apply).
type Change[S any] struct {
	// Read reads the state; a corrupt one wraps errdefs.ErrDataLoss.
	Read func() (S, error)
	// Fresh, when set, is the state that replaces a corrupt one (a
	// reconcile rebuilds it); when nil a corrupt state is an error.
	Fresh func() S
	// Decide changes the state; it reports whether to write it.
	Decide func(S) (bool, error)
	// Write writes the state (with Write of the File).
	Write func(S) error
}

// Apply holds the exclusive lock around c's read, decision and, when the
// decision changed the state, its write.
func Apply[S any](f *File, c Change[S]) error {
	return f.locked(func() error {
		st, err := c.Read()
		if c.Fresh != nil && errors.Is(err, errdefs.ErrDataLoss) {
			st, err = c.Fresh(), nil
		}
		if err != nil {
			return err
		}
		changed, err := c.Decide(st)
		if err != nil || !changed {
			return err
		}
		return c.Write(st)
	})
}

// The lock and the reads use raw descriptors: an os.File costs more than
// the system calls themselves here (poller registration, finalizer), and
// a NUMA reservation opens four files.

// locked runs fn with the exclusive lock on the lock file held.
func (f *File) locked(fn func() error) error {
	lock, err := openFile(f.lockPath, unix.O_RDWR|unix.O_CREAT, 0o600)
	if err != nil {
		return fmt.Errorf("open %s lock: %w", f.what, err)
	}
	defer unix.Close(lock) // closing the last descriptor releases the lock
	if err = retryEINTR(func() error { return unix.Flock(lock, unix.LOCK_EX) }); err != nil {
		return fmt.Errorf("lock %s: %w", f.lockPath, err)
	}
	return fn()
}

func retryEINTR(f func() error) error {
	for {
		if err := f(); !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// openFile opens path with O_CLOEXEC; errors are *fs.PathError.
func openFile(path string, flags int, mode uint32) (int, error) {
	var fd int
	err := retryEINTR(func() (err error) {
		fd, err = unix.Open(path, flags|unix.O_CLOEXEC, mode)
		return err
	})
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	return fd, nil
}

// Read returns the state file's bytes, nil when there is none. It takes
// no lock: renames make every read a whole state.
func (f *File) Read() ([]byte, error) {
	fd, err := openFile(f.path, unix.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s state: %w", f.what, err)
	}
	defer unix.Close(fd)
	size := 4 << 10
	var st unix.Stat_t
	if unix.Fstat(fd, &st) == nil && st.Size > 0 {
		size = int(st.Size) + 1 // room to read the end of file at once
	}
	b := make([]byte, 0, size)
	for {
		if len(b) == cap(b) {
			b = slices.Grow(b, cap(b))
		}
		var n int
		err := retryEINTR(func() (err error) {
			n, err = unix.Read(fd, b[len(b):cap(b)])
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("read %s state %s: %w", f.what, f.path, err)
		}
		if n == 0 {
			return b, nil
		}
		b = b[:len(b)+n]
	}
}

// Write replaces the state file with what fill writes, mode 0600. The
// caller holds the lock (it runs in a Change's Write), so one fixed
// temporary name serves; a leftover from a killed writer is truncated.
func (f *File) Write(fill func(io.Writer) error) error {
	// Durable (data and directory synced) on a disk; on a tmpfs there is
	// nothing to sync, and nothing survives a power loss anyway.
	dur := atomicfile.SyncAll
	if f.volatile {
		dur = atomicfile.NoSync
	}
	if err := atomicfile.Write(f.path, atomicfile.Options{Perm: 0o600, Durability: dur, Temp: f.tmpPath}, fill); err != nil {
		return fmt.Errorf("%s state: %w", f.what, err)
	}
	return nil
}

// ReadJSON decodes the state file into v, which it leaves as it is when
// there is no file: v holds the empty state then. A file that does not
// decode is Corrupt.
func (f *File) ReadJSON(v any) error {
	b, err := f.Read()
	if err != nil || b == nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return f.Corrupt(err)
	}
	return nil
}

// Corrupt is the error for a state file that does not decode; detail
// says why. It wraps errdefs.ErrDataLoss, which a reconcile tolerates
// (Change.Fresh).
func (f *File) Corrupt(detail any) error {
	return fmt.Errorf("%s state %s is corrupt (a shim start's reconcile rewrites it): %v: %w", f.what, f.path, detail, errdefs.ErrDataLoss)
}

// CheckVersion refuses a state file of format v newer than known, the
// newest this shim writes: errdefs.ErrFailedPrecondition.
func (f *File) CheckVersion(v, known int) error {
	if v > known {
		return fmt.Errorf("%s state %s has format %d, newer than this shim's %d: %w", f.what, f.path, v, known,
			errdefs.ErrFailedPrecondition)
	}
	return nil
}
