package numa

import (
	"fmt"
	"slices"

	"github.com/containerd/errdefs"
)

// Mode says how a VM is tied to the host's NUMA nodes.
type Mode string

const (
	// ModeNode (the default) binds the VM's memory to one node and lets its
	// vCPUs float over that node's shared CPUs, with CPU overcommit up to
	// Policy.CPUThreshold.
	ModeNode Mode = "node"
	// ModeDedicated gives each vCPU its own host CPU of one node, never
	// given to another VM, and pins QEMU's emulator threads to that node's
	// housekeeping CPUs.
	ModeDedicated Mode = "dedicated"
	// ModeNone does no pinning: the VM is recorded but counted on no node.
	ModeNone Mode = "none"
)

// ParseMode checks a mode read from configuration or a pod annotation; ""
// is ModeNode. Errors wrap errdefs.ErrInvalidArgument and quote the value;
// the caller adds which field it came from.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case "":
		return ModeNode, nil
	case ModeNode, ModeDedicated, ModeNone:
		return m, nil
	}
	return "", fmt.Errorf("unknown NUMA mode %q (want %q, %q or %q): %w", s, ModeNode, ModeDedicated, ModeNone, errdefs.ErrInvalidArgument)
}

// Policy is the placement configuration. Its zero value is the default
// policy; zero fields take their defaults.
type Policy struct {
	// CPUThreshold (config cpu_threshold, default 4.0) bounds node-mode
	// vCPUs per shared CPU of a node: CPU overcommit.
	CPUThreshold float64 `json:"cpuThreshold,omitempty"`
	// MemThreshold (config mem_threshold, default 1.0: no overcommit)
	// bounds allocated guest memory per byte of the node's MemTotal.
	MemThreshold float64 `json:"memThreshold,omitempty"`
	// AllowSpread (config allow_spread, default false): a node-mode VM
	// larger than any single node is spread over the fewest nodes that
	// can hold it, with a guest NUMA topology to match, instead of being
	// rejected.
	AllowSpread bool `json:"allowSpread,omitempty"`
	// ReservedCPUs are host CPUs never given to a VM (the kubelet's,
	// system daemons'). Optional.
	ReservedCPUs []int `json:"reservedCPUs,omitempty"`
	// MinSharedCPUs (default 1) is how many CPUs of each node are never
	// dedicated: the node's lowest-numbered usable CPUs. They carry the
	// emulator threads of dedicated VMs and keep node-mode VMs running.
	MinSharedCPUs int `json:"minSharedCPUs,omitempty"`
}

// Defaults of Policy's zero fields.
const (
	DefaultCPUThreshold  = 4.0
	DefaultMemThreshold  = 1.0
	DefaultMinSharedCPUs = 1
)

// WithDefaults returns p with its zero fields set to their defaults.
func (p Policy) WithDefaults() Policy {
	if p.CPUThreshold == 0 {
		p.CPUThreshold = DefaultCPUThreshold
	}
	if p.MemThreshold == 0 {
		p.MemThreshold = DefaultMemThreshold
	}
	if p.MinSharedCPUs == 0 {
		p.MinSharedCPUs = DefaultMinSharedCPUs
	}
	return p
}

// Validate reports a policy field out of range, naming its config key.
// Errors wrap errdefs.ErrInvalidArgument.
func (p Policy) Validate() error {
	p = p.WithDefaults()
	switch {
	case !(p.CPUThreshold > 0) || p.CPUThreshold > 1000:
		return fmt.Errorf("cpu_threshold = %v: want a number above 0 (1 is no overcommit): %w", p.CPUThreshold, errdefs.ErrInvalidArgument)
	case !(p.MemThreshold > 0) || p.MemThreshold > 1000:
		return fmt.Errorf("mem_threshold = %v: want a number above 0 (1 is no overcommit): %w", p.MemThreshold, errdefs.ErrInvalidArgument)
	case p.MinSharedCPUs < 1:
		return fmt.Errorf("min_shared_cpus = %d: want at least 1: %w", p.MinSharedCPUs, errdefs.ErrInvalidArgument)
	}
	for _, c := range p.ReservedCPUs {
		if c < 0 || c >= maxCPUID {
			return fmt.Errorf("reserved_cpus: %d is not a CPU number: %w", c, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// maxMemoryMiB (1 PiB) keeps memory arithmetic in bytes far from overflow.
const maxMemoryMiB = 1 << 30

// Request asks for one VM's placement.
type Request struct {
	// Owner identifies the VM uniquely on the host: its libvirt domain name.
	Owner     string
	VCPUs     int
	MemoryMiB int
	// Mode "" is ModeNode.
	Mode Mode
}

func (r Request) validate() (Request, error) {
	if r.Mode == "" {
		r.Mode = ModeNode
	}
	switch {
	case r.Owner == "":
		return r, fmt.Errorf("NUMA request has no owner: %w", errdefs.ErrInvalidArgument)
	case r.VCPUs < 1 || r.VCPUs > maxCPUID:
		return r, fmt.Errorf("VM %s: vcpus must be from 1 to %d, got %d: %w", r.Owner, maxCPUID, r.VCPUs, errdefs.ErrInvalidArgument)
	case r.MemoryMiB < 1 || r.MemoryMiB > maxMemoryMiB:
		return r, fmt.Errorf("VM %s: memory must be from 1 MiB to %d MiB, got %d: %w", r.Owner, maxMemoryMiB, r.MemoryMiB,
			errdefs.ErrInvalidArgument)
	}
	if _, err := ParseMode(string(r.Mode)); err != nil {
		return r, fmt.Errorf("VM %s: %w", r.Owner, err)
	}
	return r, nil
}

// Placement is where a VM runs. It is plain JSON-serialisable data: the
// Store keeps it, and the shim stores it in the libvirt domain's metadata
// so that Store.Reconcile can rebuild every reservation from libvirt.
type Placement struct {
	Owner     string `json:"owner"`
	Mode      Mode   `json:"mode"`
	VCPUs     int    `json:"vcpus"`
	MemoryMiB int    `json:"memoryMiB"`
	// Nodes are the host nodes the guest memory is bound to (numatune
	// memory mode "strict", nodeset Nodes). One node unless spread.
	Nodes []int `json:"nodes,omitempty"`
	// CPUs are the host CPUs the VM runs on: in node mode the shared
	// CPUs its vCPUs float over (<vcpu cpuset>); in dedicated mode its
	// exclusive CPUs.
	CPUs CPUList `json:"cpus,omitempty"`
	// VCPUPins (dedicated): vCPU i runs on host CPU VCPUPins[i] only.
	VCPUPins []int `json:"vcpuPins,omitempty"`
	// EmulatorCPUs (dedicated): the node's housekeeping CPUs, for QEMU's
	// emulator and I/O threads (<emulatorpin>). Never dedicated to any VM.
	EmulatorCPUs CPUList `json:"emulatorCPUs,omitempty"`
	// GuestNodes (spread only): guest NUMA cell i is GuestNodes[i].
	GuestNodes []GuestNode `json:"guestNodes,omitempty"`
}

// GuestNode is one guest NUMA cell of a VM spread over several host nodes.
type GuestNode struct {
	// HostNode holds this cell's memory (numatune memnode, strict).
	HostNode int `json:"hostNode"`
	// VCPUs are the guest vCPU numbers in this cell.
	VCPUs []int `json:"vcpus"`
	// MemoryMiB is the cell's memory.
	MemoryMiB int `json:"memoryMiB"`
	// CPUs are the host CPUs of HostNode these vCPUs float over.
	CPUs CPUList `json:"cpus"`
}

// Spread reports whether the VM spans more than one host node.
func (pl *Placement) Spread() bool { return len(pl.Nodes) > 1 }

// Clone returns a deep copy.
func (pl Placement) Clone() Placement {
	pl.Nodes = slices.Clone(pl.Nodes)
	pl.CPUs = slices.Clone(pl.CPUs)
	pl.VCPUPins = slices.Clone(pl.VCPUPins)
	pl.EmulatorCPUs = slices.Clone(pl.EmulatorCPUs)
	if pl.GuestNodes != nil {
		g := make([]GuestNode, len(pl.GuestNodes))
		for i, c := range pl.GuestNodes {
			c.VCPUs = slices.Clone(c.VCPUs)
			c.CPUs = slices.Clone(c.CPUs)
			g[i] = c
		}
		pl.GuestNodes = g
	}
	return pl
}

// matches reports whether pl was made for a request of r's size and mode.
func (pl *Placement) matches(r Request) bool {
	return pl.Mode == r.Mode && pl.VCPUs == r.VCPUs && pl.MemoryMiB == r.MemoryMiB
}
