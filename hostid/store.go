package hostid

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/nodestate"
)

// Range is an inclusive range of host ids: each VM gets uid N and gid N
// for one N in it.
type Range struct {
	First, Last uint32
}

// MinID is the lowest id a range may hold: below it live system users
// (0-999), ordinary users (login.defs' UID_MAX is 60000), nobody (65534)
// and the 16-bit "no id" 65535.
const MinID = 65536

// maxID is the highest usable id: 4294967295 is (uid_t)-1, which chown
// and setresuid read as "leave unchanged".
const maxID = 1<<32 - 2

// DefaultRange is above every range useradd hands out as subordinate ids
// (login.defs' SUB_UID_MAX is 600100000) and above what kubelet maps
// user-namespaced pods to, so its ids collide with no user on a usual
// node.
const DefaultRange = "1000000000-1000065535"

// ParseRange reads "FIRST-LAST" (inclusive, decimal). A range that
// reaches below MinID or up to (uid_t)-1, or whose LAST is below FIRST,
// is refused with an error naming the bound.
func ParseRange(s string) (Range, error) {
	a, b, ok := strings.Cut(strings.TrimSpace(s), "-")
	if !ok {
		return Range{}, fmt.Errorf("id range %q: want FIRST-LAST, e.g. %s: %w", s, DefaultRange, errdefs.ErrInvalidArgument)
	}
	first, err := strconv.ParseUint(strings.TrimSpace(a), 10, 32)
	if err != nil {
		return Range{}, fmt.Errorf("id range %q: first id: %v: %w", s, err, errdefs.ErrInvalidArgument)
	}
	last, err := strconv.ParseUint(strings.TrimSpace(b), 10, 32)
	if err != nil {
		return Range{}, fmt.Errorf("id range %q: last id: %v: %w", s, err, errdefs.ErrInvalidArgument)
	}
	r := Range{First: uint32(first), Last: uint32(last)}
	return r, r.Validate()
}

// Validate checks the bounds of r.
func (r Range) Validate() error {
	switch {
	case r.Last < r.First:
		return fmt.Errorf("id range %s: last id is below the first: %w", r, errdefs.ErrInvalidArgument)
	case r.First < MinID:
		return fmt.Errorf("id range %s: starts below %d, among system and ordinary users (and nobody, 65534): %w", r, MinID,
			errdefs.ErrInvalidArgument)
	case r.Last > maxID:
		return fmt.Errorf("id range %s: ends above %d (4294967295 is the invalid id -1): %w", r, uint32(maxID), errdefs.ErrInvalidArgument)
	}
	return nil
}

// Size is how many ids r holds.
func (r Range) Size() uint64 { return uint64(r.Last) - uint64(r.First) + 1 }

// Contains reports whether id is in r.
func (r Range) Contains(id uint32) bool { return id >= r.First && id <= r.Last }

func (r Range) String() string { return fmt.Sprintf("%d-%d", r.First, r.Last) }

// stateVersion is the format of the state file this package writes.
const stateVersion = 1

// holder is the process that allocated an id whose domain libvirt may
// not know yet.
type holder = nodestate.Holder

type allocation struct {
	Owner string `json:"owner"`
	ID    uint32 `json:"id"`
	// Holder is the allocating process, until a reconcile finds the
	// owner among libvirt's domains; nil: libvirt vouches for it.
	Holder *holder `json:"holder,omitempty"`
}

type stateFile struct {
	Version int `json:"version"`
	// Last is the id handed out last: allocation goes on after it.
	Last        uint32       `json:"last"`
	Allocations []allocation `json:"allocations"`
}

func (st *stateFile) find(owner string) int {
	return slices.IndexFunc(st.Allocations, func(a allocation) bool { return a.Owner == owner })
}

// Store is the node's per-VM identities, shared by every shim process
// under nodestate's scheme (flock, rename, synced on a disk). It holds no
// open file between calls; it is safe for concurrent use by goroutines
// and processes.
type Store struct {
	file *nodestate.File
	r    Range
	self holder
	// alive reports whether a holder still runs; tests replace it.
	alive func(holder) bool
}

// OpenStore returns the store at path handing out ids of r. It touches no
// file; the directory of path must exist when the store is first changed.
func OpenStore(path string, r Range) (*Store, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	self, err := nodestate.Self()
	if err != nil {
		return nil, fmt.Errorf("open id store: %w", err)
	}
	return &Store{file: nodestate.Open(path, "id"), r: r, self: self, alive: holder.Alive}, nil
}

// Range is the range the store hands ids out of.
func (s *Store) Range() Range { return s.r }

// Allocate gives owner an id no other owner holds. It is idempotent: an
// owner that holds one gets it back (and the caller becomes its holder).
// A range with no free id left is errdefs.ErrResourceExhausted.
func (s *Store) Allocate(owner string) (uint32, error) {
	if owner == "" {
		return 0, fmt.Errorf("allocate a host id: empty owner: %w", errdefs.ErrInvalidArgument)
	}
	var id uint32
	err := s.lockedDo(false, func(st *stateFile) (bool, error) {
		if i := st.find(owner); i >= 0 {
			a := &st.Allocations[i]
			id = a.ID
			if a.Holder == nil || *a.Holder == s.self {
				return false, nil
			}
			a.Holder = &s.self
			return true, nil
		}
		used := make(map[uint32]bool, len(st.Allocations))
		for _, a := range st.Allocations {
			used[a.ID] = true
		}
		if uint64(len(used)) >= s.r.Size() {
			return false, fmt.Errorf("allocate a host id for VM %s: all %d ids of range %s are in use: %w", owner, s.r.Size(), s.r,
				errdefs.ErrResourceExhausted)
		}
		next := st.Last
		for {
			if next >= s.r.Last || next < s.r.First {
				next = s.r.First
			} else {
				next++
			}
			if !used[next] {
				break
			}
		}
		id, st.Last = next, next
		st.Allocations = append(st.Allocations, allocation{Owner: owner, ID: id, Holder: &s.self})
		return true, nil
	})
	return id, err
}

// Release frees owner's id. An owner without one is not an error: delete
// paths call it whatever state they find.
func (s *Store) Release(owner string) error {
	return s.lockedDo(false, func(st *stateFile) (bool, error) {
		i := st.find(owner)
		if i < 0 {
			return false, nil
		}
		st.Allocations = slices.Delete(st.Allocations, i, i+1)
		return true, nil
	})
}

// ReconcileWith makes the state match libvirt, listing its domains with
// list while the lock is held (a delete that undefines its domain and
// then releases its id cannot interleave). list returns the id each live
// owner's domain runs under. Afterwards the state holds exactly the live
// ids, plus allocations missing from live whose allocating process still
// runs and whose id no live owner has; everything else is freed and its
// owner returned. A corrupt state file is replaced.
func (s *Store) ReconcileWith(list func() (map[string]uint32, error)) (dropped []string, err error) {
	err = s.lockedDo(true, func(st *stateFile) (bool, error) {
		live, listErr := list()
		if listErr != nil {
			return false, listErr
		}
		liveIDs := make(map[uint32]string, len(live))
		owners := make([]string, 0, len(live))
		for owner, id := range live {
			if other, dup := liveIDs[id]; dup {
				// Two domains under one id: both stay recorded (the id
				// is taken), and whoever reads the log learns of it.
				dropped = append(dropped, fmt.Sprintf("(id %d is live twice: %s and %s)", id, other, owner))
			}
			liveIDs[id] = owner
			owners = append(owners, owner)
		}
		slices.Sort(owners)
		var kept []allocation
		for _, o := range owners {
			kept = append(kept, allocation{Owner: o, ID: live[o]})
		}
		for _, a := range st.Allocations {
			if _, ok := live[a.Owner]; ok {
				continue
			}
			if _, taken := liveIDs[a.ID]; !taken && a.Holder != nil && s.alive(*a.Holder) {
				kept = append(kept, a)
				continue
			}
			dropped = append(dropped, a.Owner)
		}
		st.Allocations = kept
		return true, nil
	})
	return dropped, err
}

// Snapshot returns every owner's id. It reads without the lock: renames
// make every read a whole state.
func (s *Store) Snapshot() (map[string]uint32, error) {
	st, err := s.read()
	if err != nil {
		return nil, err
	}
	out := make(map[string]uint32, len(st.Allocations))
	for _, a := range st.Allocations {
		out[a.Owner] = a.ID
	}
	return out, nil
}

func (s *Store) read() (*stateFile, error) {
	st := &stateFile{Version: stateVersion}
	if err := s.file.ReadJSON(st); err != nil {
		return nil, err
	}
	return st, s.file.CheckVersion(st.Version, stateVersion)
}

// lockedDo holds the exclusive lock around reading the state, fn and,
// when fn reports a change, writing it. With tolerateCorrupt a corrupt
// state reaches fn as an empty one.
func (s *Store) lockedDo(tolerateCorrupt bool, fn func(*stateFile) (bool, error)) error {
	c := nodestate.Change[*stateFile]{Read: s.read, Decide: fn, Write: s.writeLocked}
	if tolerateCorrupt {
		c.Fresh = func() *stateFile { return &stateFile{} }
	}
	return nodestate.Apply(s.file, c)
}

// writeLocked replaces the state file, the lock held: indented JSON, as
// people read it.
func (s *Store) writeLocked(st *stateFile) error {
	st.Version = stateVersion
	b, err := json.MarshalIndent(st, "", " ")
	if err != nil {
		return err
	}
	return s.file.Write(func(w io.Writer) error {
		_, err := w.Write(append(b, '\n'))
		return err
	})
}
