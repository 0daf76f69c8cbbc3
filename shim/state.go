package shim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/atomicfile"
	"github.com/kvm-shim/containerd-shim-kvm-v1/netfd"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// recordFile is the shim's record of one task, kept in the task's bundle.
const recordFile = "kvm-task.json"

// Kinds of task.
const (
	kindSandbox = "sandbox"
	kindVM      = "vm"
	kindPlain   = "plain" // a container without a VM image, run by runc
)

// taskRecord is everything the shim made for one task. It is written
// before the first side effect is left in place, so that the cleanup
// `delete` run by containerd after a shim died, or a new shim, can undo or
// adopt exactly what belongs to this task and nothing else.
type taskRecord struct {
	Kind          string `json:"kind"`
	ID            string `json:"id"`
	Namespace     string `json:"namespace"`
	StateDir      string `json:"stateDir"`
	LibvirtSocket string `json:"libvirtSocket"`
	Pid           int    `json:"pid,omitempty"`
	// Runc: containerd's runc task code runs the task (plain containers,
	// and the sandbox's pause with plain_containers on): a cleanup
	// deletes its runc container and unmounts its rootfs.
	Runc bool `json:"runc,omitempty"`

	// VM tasks.
	Domain  string `json:"domain,omitempty"`
	VMDir   string `json:"vmDir,omitempty"`
	Overlay string `json:"overlay,omitempty"`
	// KeepOverlay: the overlay is per-pod data and outlives the task.
	KeepOverlay bool `json:"keepOverlay,omitempty"`

	// NUMA reservation: its owner key in the node's store file.
	NUMAOwner string `json:"numaOwner,omitempty"`
	NUMAStore string `json:"numaStore,omitempty"`

	// Host identity the VM runs under, when per-VM identities are on:
	// its owner key in the node's store file and that store's range.
	IDOwner  string       `json:"idOwner,omitempty"`
	IDStore  string       `json:"idStore,omitempty"`
	IDRange  string       `json:"idRange,omitempty"`
	Identity *vm.Identity `json:"identity,omitempty"`

	// Network: the TAP and tc wiring in the pod namespace.
	Network *vmNetwork `json:"network,omitempty"`

	// PodNetwork: the pod network the sandbox found (sandbox tasks).
	PodNetwork *netfd.PodNetwork `json:"podNetwork,omitempty"`
	// Cgroup is the container's cgroup QEMU is charged to;
	// CgroupCreated: this task made it and removes it.
	Cgroup        string `json:"cgroup,omitempty"`
	CgroupCreated bool   `json:"cgroupCreated,omitempty"`

	// Pod membership (sandbox and VM tasks of a CRI pod).
	PodUID string `json:"podUID,omitempty"`
}

func writeRecord(bundle string, r *taskRecord) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	// The data is synced, so a record that exists is whole. A power loss
	// may still undo the rename (the previous record, or none, comes
	// back); it also ends the VM the record describes.
	return atomicfile.WriteFile(filepath.Join(bundle, recordFile), b, atomicfile.Options{Perm: 0o600, Durability: atomicfile.SyncData})
}

// readRecord returns the task's record, or nil when the shim never wrote
// one (it died before its first side effect).
func readRecord(bundle string) (*taskRecord, error) {
	b, err := os.ReadFile(filepath.Join(bundle, recordFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r taskRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("parse %s: %w", filepath.Join(bundle, recordFile), err)
	}
	if r.Network != nil && len(r.Network.Links) == 0 {
		// "links": [] and no links are one record: writeRecord omits
		// both, so what is read here is what a write and read give back.
		r.Network.Links = nil
	}
	return &r, nil
}

func removeRecord(bundle string) error {
	if err := os.Remove(filepath.Join(bundle, recordFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
