package numa

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"

	"github.com/containerd/errdefs"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/nodestate"
)

// stateVersion is the format of the state file this package writes.
const stateVersion = 1

// Store keeps the host's NUMA reservations in a state file shared by every
// shim process on the node, under nodestate's scheme: an exclusive flock
// around each change, writes through a temporary file renamed over the
// state, synced on a disk. The file is one JSON document (jq reads it)
// laid out as a header line with per-node summaries, then one reservation
// per line: Reserve and Release decode the summaries and the one line
// they touch, and copy the rest, so their cost hardly grows with the
// number of VMs. A Store holds no open file between calls and is safe for
// concurrent use by many goroutines and processes.
type Store struct {
	file   *nodestate.File
	topo   *Topology
	policy Policy

	// self identifies this process as the holder of what it reserves.
	self holder
	// alive reports whether a holder process still runs; tests replace it.
	alive func(holder) bool
	// writeHook, when a test sets it, runs at named points of a write:
	// "tmp-partial" (half the temporary file written) and "before-rename".
	// nil in every store the shim opens.
	writeHook func(stage string)
}

// holder is the process that reserved a placement whose domain libvirt
// may not know yet.
type holder = nodestate.Holder

// stateFile is the JSON document at the Store's path. The Store writes
// it as a header line (everything up to the reservations array), one line
// per reservation and a closing line, so that Reserve and Release can
// decode the header and only the reservation they touch (see rawState).
type stateFile struct {
	Version int `json:"version"`
	// Generation counts writes, for people and tests reading the file.
	Generation uint64 `json:"generation"`
	// Nodes summarise the reservations per node (summarize).
	Nodes []nodeSummary `json:"nodes"`
	// Reservations are in placement order: Overlaps relies on it.
	Reservations []reservation `json:"reservations"`
}

type reservation struct {
	Placement // first, so that each line starts with its owner
	// Holder is set from Reserve until a Reconcile finds the owner among
	// libvirt's domains; nil means libvirt vouches for it.
	Holder *holder `json:"holder,omitempty"`
}

// stateHeader is the state file without its reservations.
type stateHeader struct {
	Version    int           `json:"version"`
	Generation uint64        `json:"generation"`
	Nodes      []nodeSummary `json:"nodes"`
}

// rawState is the state file as the Store updates it: the header decoded,
// each reservation kept as its line of JSON.
type rawState struct {
	header stateHeader
	lines  [][]byte
}

const (
	reservationsKey = `,"reservations":[`
	closingLine     = "]}"
)

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
	self, err := nodestate.Self()
	if err != nil {
		return nil, fmt.Errorf("open NUMA store: %w", err)
	}
	return &Store{
		file:   nodestate.Open(path, "NUMA"),
		topo:   t,
		policy: p.WithDefaults(),
		self:   self,
		alive:  holderAlive,
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
	err = s.update(func(st *rawState) (bool, error) {
		if i := st.find(r.Owner); i >= 0 {
			res, decodeErr := st.decode(i)
			if decodeErr != nil {
				return false, decodeErr
			}
			if !res.matches(r) {
				return false, fmt.Errorf("VM %s already holds a NUMA placement for %d vCPUs, %s, mode %s; asked for %s: %w",
					r.Owner, res.VCPUs, formatMiB(int64(res.MemoryMiB)), res.Mode, describeRequest(r), errdefs.ErrAlreadyExists)
			}
			out = res.Placement
			if res.Holder == nil || *res.Holder == s.self {
				return false, nil
			}
			res.Holder = &s.self
			var marshalErr error
			st.lines[i], marshalErr = json.Marshal(res)
			return true, marshalErr
		}
		pl, decideErr := newLedgerFromSummary(s.topo, s.policy, st.header.Nodes).decide(r)
		if decideErr != nil {
			return false, decideErr
		}
		line, marshalErr := json.Marshal(reservation{Placement: pl, Holder: &s.self})
		if marshalErr != nil {
			return false, marshalErr
		}
		st.lines = append(st.lines, line)
		st.header.Nodes = addToSummary(st.header.Nodes, &pl, 1)
		out = pl
		return true, nil
	})
	return out, err
}

// Release drops the owner's reservation. An owner without one is not an
// error, so delete paths can call it whatever state they find.
func (s *Store) Release(owner string) error {
	return s.update(func(st *rawState) (bool, error) {
		i := st.find(owner)
		if i < 0 {
			return false, nil
		}
		res, err := st.decode(i)
		if err != nil {
			return false, err
		}
		st.header.Nodes = addToSummary(st.header.Nodes, &res.Placement, -1)
		st.lines = slices.Delete(st.lines, i, i+1)
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
// corrupt state file is replaced, and the per-node summaries are
// recomputed. Duplicate or empty owners in live are
// errdefs.ErrInvalidArgument and change nothing.
func (s *Store) Reconcile(live []Placement) (dropped []string, err error) {
	return s.ReconcileWith(func() ([]Placement, error) { return live, nil })
}

// ReconcileWith is Reconcile with the live placements listed by list while
// the state's lock is held. A shim lists libvirt's domains this way: a
// cleanup that undefines a domain and then releases its reservation
// between a listing made before the lock and the reconcile would see its
// release undone, the gone domain's placement put back for good.
func (s *Store) ReconcileWith(list func() ([]Placement, error)) (dropped []string, err error) {
	err = s.lockedDo(true, func(st *rawState) (bool, error) {
		live, listErr := list()
		if listErr != nil {
			return false, listErr
		}
		liveByOwner := make(map[string]int, len(live))
		for i, pl := range live {
			if pl.Owner == "" {
				return false, fmt.Errorf("reconcile NUMA reservations: live placement %d has no owner: %w", i, errdefs.ErrInvalidArgument)
			}
			if _, dup := liveByOwner[pl.Owner]; dup {
				return false, fmt.Errorf("reconcile NUMA reservations: owner %s is live twice: %w", pl.Owner, errdefs.ErrInvalidArgument)
			}
			liveByOwner[pl.Owner] = i
		}
		var known, kept []reservation
		seen := map[string]bool{}
		for i := range st.lines {
			res, decodeErr := st.decode(i)
			if decodeErr != nil {
				dropped = append(dropped, fmt.Sprintf("(unreadable reservation %d)", i))
				continue
			}
			if j, ok := liveByOwner[res.Owner]; ok {
				kept = append(kept, reservation{Placement: live[j].Clone()})
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
		all := append(known, kept...)
		st.lines = st.lines[:0]
		ps := make([]Placement, len(all))
		for i, res := range all {
			line, marshalErr := json.Marshal(res)
			if marshalErr != nil {
				return false, marshalErr
			}
			st.lines = append(st.lines, line)
			ps[i] = res.Placement
		}
		st.header.Nodes = summarize(ps)
		return true, nil
	})
	return dropped, err
}

// Snapshot returns the reservations in placement order. It reads the
// state file without the lock: renames make every read a whole state.
func (s *Store) Snapshot() ([]Placement, error) {
	st, err := s.readFull()
	if err != nil {
		return nil, err
	}
	ps := make([]Placement, len(st.Reservations))
	for i := range st.Reservations {
		ps[i] = st.Reservations[i].Placement
	}
	return ps, nil
}

// Topology returns the topology the store places on.
func (s *Store) Topology() *Topology { return s.topo }

// Policy returns the store's policy, defaults filled in.
func (s *Store) Policy() Policy { return s.policy }

// update runs fn on the state under the lock and writes the state back
// when fn reports a change.
func (s *Store) update(fn func(*rawState) (bool, error)) error {
	return s.lockedDo(false, fn)
}

// lockedDo holds the exclusive lock around reading the state, fn and,
// when fn reports a change, writing it. With tolerateCorrupt a corrupt
// state reaches fn as an empty one.
func (s *Store) lockedDo(tolerateCorrupt bool, fn func(*rawState) (bool, error)) error {
	c := nodestate.Change[*rawState]{Read: s.readRaw, Decide: fn, Write: s.writeLocked}
	if tolerateCorrupt {
		c.Fresh = func() *rawState { return &rawState{} }
	}
	return nodestate.Apply(s.file, c)
}

// readFull decodes the whole state file; a missing file is an empty
// state. A file that does not parse wraps errdefs.ErrDataLoss.
func (s *Store) readFull() (*stateFile, error) {
	st := &stateFile{Version: stateVersion}
	if err := s.file.ReadJSON(st); err != nil {
		return nil, err
	}
	return st, s.file.CheckVersion(st.Version, stateVersion)
}

// readRaw reads the state file for an update: it decodes the header line
// and keeps the reservation lines as they are. A file not laid out as the
// Store writes it (edited by hand) is decoded whole, and its summaries
// recomputed.
func (s *Store) readRaw() (*rawState, error) {
	b, err := s.file.Read()
	if err != nil || b == nil {
		return &rawState{header: stateHeader{Version: stateVersion}}, err
	}
	st := &rawState{}
	head, rest, _ := bytes.Cut(b, []byte{'\n'})
	if h, ok := bytes.CutSuffix(head, []byte(reservationsKey)); ok {
		if err = json.Unmarshal(append(h, '}'), &st.header); err != nil {
			return nil, s.file.Corrupt(err)
		}
		if err = s.file.CheckVersion(st.header.Version, stateVersion); err != nil {
			return nil, err
		}
		for {
			line, after, found := bytes.Cut(rest, []byte{'\n'})
			if string(line) == closingLine && len(bytes.TrimSpace(after)) == 0 {
				return st, nil
			}
			if !found || len(line) == 0 {
				return nil, s.file.Corrupt("no closing line")
			}
			st.lines = append(st.lines, bytes.TrimSuffix(line, []byte{','}))
			rest = after
		}
	}
	full, err := s.readFull()
	if err != nil {
		return nil, err
	}
	st.header = stateHeader{Version: full.Version, Generation: full.Generation}
	ps := make([]Placement, len(full.Reservations))
	for i, res := range full.Reservations {
		line, err := json.Marshal(res)
		if err != nil {
			return nil, err
		}
		st.lines = append(st.lines, line)
		ps[i] = res.Placement
	}
	st.header.Nodes = summarize(ps)
	return st, nil
}

// writeLocked replaces the state file atomically, the lock held, with
// the next generation of st.
func (s *Store) writeLocked(st *rawState) error {
	st.header.Version = stateVersion
	st.header.Generation++
	if st.header.Nodes == nil {
		st.header.Nodes = []nodeSummary{}
	}
	head, err := json.Marshal(st.header)
	if err != nil {
		return fmt.Errorf("encode NUMA state: %w", err)
	}
	size := len(head) + len(reservationsKey) + len(closingLine) + 2
	for _, l := range st.lines {
		size += len(l) + 2
	}
	b := make([]byte, 0, size)
	b = append(append(b, head[:len(head)-1]...), reservationsKey+"\n"...)
	for i, l := range st.lines {
		b = append(b, l...)
		if i < len(st.lines)-1 {
			b = append(b, ',')
		}
		b = append(b, '\n')
	}
	b = append(b, closingLine+"\n"...)

	return s.file.Write(func(w io.Writer) error {
		if s.writeHook != nil {
			half := len(b) / 2
			if _, werr := w.Write(b[:half]); werr != nil {
				return werr
			}
			s.writeHook("tmp-partial")
			b = b[half:]
		}
		if _, werr := w.Write(b); werr != nil {
			return werr
		}
		if s.writeHook != nil {
			s.writeHook("before-rename") // the temporary file is whole
		}
		return nil
	})
}

// find returns the index of the owner's line, or -1. Each line starts
// with the owner, encoded as json.Marshal encodes it.
func (st *rawState) find(owner string) int {
	q, _ := json.Marshal(owner)
	prefix := append(append([]byte(`{"owner":`), q...), ',')
	for i, l := range st.lines {
		if bytes.HasPrefix(l, prefix) {
			return i
		}
	}
	return -1
}

func (st *rawState) decode(i int) (reservation, error) {
	var res reservation
	if err := json.Unmarshal(st.lines[i], &res); err != nil {
		return res, fmt.Errorf("NUMA state: reservation %d is corrupt: %v: %w", i, err, errdefs.ErrDataLoss)
	}
	return res, nil
}

// holderAlive is Holder.Alive: when /proc cannot tell, the holder counts
// as alive, since a leaked reservation is better than a CPU dedicated
// twice.
func holderAlive(h holder) bool { return h.Alive() }
