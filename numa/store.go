package numa

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// stateVersion is the format of the state file this package writes.
const stateVersion = 1

// Store keeps the host's NUMA reservations in a state file shared by every
// shim process on the node. Each change takes an exclusive flock on a
// lock file beside it (path + ".lock", never replaced, so the lock and the
// data cannot drift apart), reads the state, decides, writes path + ".tmp",
// fsyncs it, renames it over path and fsyncs the directory. Readers
// therefore see the old state or the new one, never a torn file, and a
// process killed while holding the lock loses it with its file
// descriptors. A Store holds no open file between calls and is safe for
// concurrent use by many goroutines and processes.
type Store struct {
	path, lockPath, tmpPath string
	topo                    *Topology
	policy                  Policy

	// self identifies this process as the holder of what it reserves.
	self holder
	// alive reports whether a holder process still runs; tests replace it.
	alive func(holder) bool
}

// holder is the process that reserved a placement whose domain libvirt
// may not know yet. Pid with its start time (clock ticks since boot,
// /proc/<pid>/stat field 22) survives pid reuse.
type holder struct {
	Pid   int    `json:"pid"`
	Start uint64 `json:"start"`
}

// stateFile is the JSON document at the Store's path.
type stateFile struct {
	Version int `json:"version"`
	// Generation counts writes, for people and tests reading the file.
	Generation uint64 `json:"generation"`
	// Reservations are in placement order: Overlaps relies on it.
	Reservations []reservation `json:"reservations"`
}

type reservation struct {
	Placement
	// Holder is set from Reserve until a Reconcile finds the owner among
	// libvirt's domains; nil means libvirt vouches for it.
	Holder *holder `json:"holder,omitempty"`
}

// testHook, when set by a test, runs at named points of a write:
// "tmp-partial" (half the temporary file written) and "before-rename".
var testHook func(stage string)

// OpenStore returns the store whose state file is path, for placing VMs
// on t under p. It touches no file: the directory of path must exist
// when the store is first changed (the shim creates its state dir), and
// a missing state file is an empty one. The state is per boot, like the
// VMs it describes; a tmpfs (/run) keeps its fsyncs cheap.
func OpenStore(path string, t *Topology, p Policy) (*Store, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	self := holder{Pid: os.Getpid()}
	start, err := processStart(self.Pid)
	if err != nil {
		return nil, fmt.Errorf("open NUMA store: %w", err)
	}
	self.Start = start
	return &Store{
		path:     path,
		lockPath: path + ".lock",
		tmpPath:  path + ".tmp",
		topo:     t,
		policy:   p.WithDefaults(),
		self:     self,
		alive:    holderAlive,
	}, nil
}

// Reserve places the VM and records the placement, all under the lock so
// that no two processes decide on the same state. It is idempotent per
// owner: an owner that already holds a placement gets it back (the
// caller becomes its holder), provided the size and mode are the same;
// otherwise the error wraps errdefs.ErrAlreadyExists. Placement errors
// are Place's.
func (s *Store) Reserve(r Request) (Placement, error) {
	r, err := r.validate()
	if err != nil {
		return Placement{}, err
	}
	var out Placement
	err = s.update(func(st *stateFile) (bool, error) {
		if i := st.find(r.Owner); i >= 0 {
			res := &st.Reservations[i]
			if !res.matches(r) {
				return false, fmt.Errorf("VM %s already holds a NUMA placement for %d vCPUs, %s, mode %s; asked for %s: %w",
					r.Owner, res.VCPUs, formatMiB(int64(res.MemoryMiB)), res.Mode, describeRequest(r), errdefs.ErrAlreadyExists)
			}
			out = res.Clone()
			if res.Holder == nil || *res.Holder == s.self {
				return false, nil
			}
			res.Holder = &s.self
			return true, nil
		}
		pl, err := Place(s.topo, s.policy, st.placements(), r)
		if err != nil {
			return false, err
		}
		st.Reservations = append(st.Reservations, reservation{Placement: pl, Holder: &s.self})
		out = pl.Clone()
		return true, nil
	})
	return out, err
}

// Release drops the owner's reservation. An owner without one is not an
// error, so delete paths can call it whatever state they find.
func (s *Store) Release(owner string) error {
	return s.update(func(st *stateFile) (bool, error) {
		i := st.find(owner)
		if i < 0 {
			return false, nil
		}
		st.Reservations = slices.Delete(st.Reservations, i, i+1)
		return true, nil
	})
}

// Reconcile makes the state match libvirt, to be called when a shim
// starts. live are the placements stored in the metadata of every domain
// of ours that libvirt has defined, running or not. Afterwards the state
// holds exactly:
//
//   - every live placement, as libvirt has it, in the state's order; live
//     owners the state did not know come first, as the oldest;
//   - reservations missing from live whose reserving process still runs:
//     another shim between Reserve and defining its domain.
//
// Everything else, above all the reservations of shims that died before
// defining their domain, is dropped; their owners are returned. A
// corrupt state file is replaced. Duplicate or empty owners in live are
// errdefs.ErrInvalidArgument and change nothing.
func (s *Store) Reconcile(live []Placement) (dropped []string, err error) {
	liveByOwner := make(map[string]int, len(live))
	for i, pl := range live {
		if pl.Owner == "" {
			return nil, fmt.Errorf("reconcile NUMA reservations: live placement %d has no owner: %w", i, errdefs.ErrInvalidArgument)
		}
		if _, dup := liveByOwner[pl.Owner]; dup {
			return nil, fmt.Errorf("reconcile NUMA reservations: owner %s is live twice: %w", pl.Owner, errdefs.ErrInvalidArgument)
		}
		liveByOwner[pl.Owner] = i
	}
	err = s.lockedDo(true, func(st *stateFile, readErr error) (bool, error) {
		if readErr != nil && !errors.Is(readErr, errdefs.ErrDataLoss) {
			return false, readErr
		}
		var known, kept []reservation
		seen := map[string]bool{}
		for _, res := range st.Reservations {
			if i, ok := liveByOwner[res.Owner]; ok {
				kept = append(kept, reservation{Placement: live[i].Clone()})
				seen[res.Owner] = true
			} else if res.Holder != nil && s.alive(*res.Holder) {
				kept = append(kept, res)
			} else {
				dropped = append(dropped, res.Owner)
			}
		}
		for _, pl := range live {
			if !seen[pl.Owner] {
				known = append(known, reservation{Placement: pl.Clone()})
			}
		}
		st.Reservations = append(known, kept...)
		return true, nil
	})
	return dropped, err
}

// Snapshot returns the reservations in placement order. It reads the
// state file without the lock: renames make every read a whole state.
func (s *Store) Snapshot() ([]Placement, error) {
	st, err := s.read()
	if err != nil {
		return nil, err
	}
	return st.placements(), nil
}

// Topology and Policy are what the store places with.
func (s *Store) Topology() *Topology { return s.topo }

// Policy returns the store's policy, defaults filled in.
func (s *Store) Policy() Policy { return s.policy }

// update runs fn on the state under the lock and writes the state back
// when fn reports a change.
func (s *Store) update(fn func(*stateFile) (bool, error)) error {
	return s.lockedDo(false, func(st *stateFile, readErr error) (bool, error) {
		if readErr != nil {
			return false, readErr
		}
		return fn(st)
	})
}

// lockedDo holds the exclusive lock around reading the state, fn and,
// when fn reports a change, writing it. With tolerateCorrupt a corrupt
// state reaches fn as an empty state and the read error.
func (s *Store) lockedDo(tolerateCorrupt bool, fn func(*stateFile, error) (bool, error)) error {
	lock, err := os.OpenFile(s.lockPath, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("open NUMA lock: %w", err)
	}
	defer lock.Close() // closing the last descriptor releases the lock
	if err := flock(lock, unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", s.lockPath, err)
	}
	st, readErr := s.read()
	if readErr != nil && !(tolerateCorrupt && errors.Is(readErr, errdefs.ErrDataLoss)) {
		return readErr
	}
	if readErr != nil {
		st = &stateFile{}
	}
	changed, err := fn(st, readErr)
	if err != nil || !changed {
		return err
	}
	st.Version = stateVersion
	st.Generation++
	return s.writeLocked(st)
}

func flock(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// read parses the state file; a missing file is an empty state. A file
// that does not parse wraps errdefs.ErrDataLoss.
func (s *Store) read() (*stateFile, error) {
	b, err := os.ReadFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return &stateFile{Version: stateVersion}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read NUMA state: %w", err)
	}
	var st stateFile
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("NUMA state %s is corrupt (a shim start's Reconcile rewrites it): %v: %w", s.path, err, errdefs.ErrDataLoss)
	}
	if st.Version > stateVersion {
		return nil, fmt.Errorf("NUMA state %s has format %d, newer than this shim's %d: %w", s.path, st.Version, stateVersion, errdefs.ErrFailedPrecondition)
	}
	return &st, nil
}

// writeLocked replaces the state file atomically and durably: temporary
// file, fsync, rename, fsync of the directory. The caller holds the lock,
// so one fixed temporary name serves; a leftover from a killed writer is
// truncated.
func (s *Store) writeLocked(st *stateFile) error {
	b, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("encode NUMA state: %w", err)
	}
	f, err := os.OpenFile(s.tmpPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("write NUMA state: %w", err)
	}
	half := len(b) / 2
	_, err = f.Write(b[:half])
	if err == nil && testHook != nil {
		testHook("tmp-partial")
	}
	if err == nil {
		_, err = f.Write(b[half:])
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write NUMA state %s: %w", s.tmpPath, err)
	}
	if testHook != nil {
		testHook("before-rename")
	}
	if err := os.Rename(s.tmpPath, s.path); err != nil {
		return fmt.Errorf("write NUMA state: %w", err)
	}
	dir, err := os.Open(filepath.Dir(s.path))
	if err != nil {
		return fmt.Errorf("sync NUMA state dir: %w", err)
	}
	defer dir.Close()
	if err := dir.Sync(); err != nil {
		return fmt.Errorf("sync NUMA state dir: %w", err)
	}
	return nil
}

func (st *stateFile) find(owner string) int {
	for i := range st.Reservations {
		if st.Reservations[i].Owner == owner {
			return i
		}
	}
	return -1
}

func (st *stateFile) placements() []Placement {
	ps := make([]Placement, len(st.Reservations))
	for i := range st.Reservations {
		ps[i] = st.Reservations[i].Placement
	}
	return ps
}

// holderAlive: the process runs and is the same one (same start time).
// When /proc cannot tell, the holder counts as alive: a leaked
// reservation is better than a CPU dedicated twice.
func holderAlive(h holder) bool {
	start, err := processStart(h.Pid)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ESRCH) {
		return false
	}
	return err != nil || start == h.Start
}

// processStart reads field 22 (starttime) of /proc/<pid>/stat.
func processStart(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces and parentheses.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 20 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	return strconv.ParseUint(fields[19], 10, 64)
}
