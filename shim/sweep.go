package shim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/moby/sys/mountinfo"

	"github.com/kvm-shim/containerd-shim-kvm-v1/netfd"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// A VM's runtime dir (vms/<key>/) and domain definition are released by
// the task's delete, or by the cleanup `delete` containerd runs after a
// shim died, both from the task record in the bundle. After a power loss
// the bundle (on tmpfs) is gone with containerd's state, so nothing would
// release them: the sweep does, at the first libvirt connection of each
// shim (a pod's sandbox start or a VM's create).
//
// What belongs to no live VM: a domain of this state dir that is not
// running and whose runtime dir's owner (the shim that made it) is gone;
// a runtime dir that no domain refers to, whose owner is gone. A running
// domain is never touched: its shim may be dead while containerd is away,
// and containerd's cleanup decides about it when it returns.

// ownerFile in a VM's runtime dir names the shim that made the dir, by pid
// and start time (as a sandbox marker does).
const ownerFile = "owner.json"

// sweepGrace spares a runtime dir without an owner file (made by a shim
// before it wrote one, or by an older shim) while it is this young.
const sweepGrace = time.Minute

// sweeper is what the sweep needs of libvirt.
type sweeper interface {
	Domains() (map[string]vm.Metadata, error)
	State(name string) (vm.State, error)
	Metadata(name string) (vm.Metadata, error)
	Undefine(name string) error
}

// ownerGone reports whether the shim that made vmDir is gone. A dir
// without an owner file counts as gone once it is older than sweepGrace;
// a missing dir has no owner.
func ownerGone(vmDir string, now time.Time) bool {
	st, err := os.Stat(vmDir)
	if errors.Is(err, os.ErrNotExist) {
		return true
	}
	if err != nil {
		return false
	}
	if _, err := os.Stat(filepath.Join(vmDir, ownerFile)); errors.Is(err, os.ErrNotExist) {
		return now.Sub(st.ModTime()) > sweepGrace
	}
	return !markerAlive(filepath.Join(vmDir, ownerFile))
}

// sweepScope is what a sweep looks at: the state dir's layout, libvirt,
// the dir of the VMs' descriptor sockets, and release (nil: nothing to
// give back), which gives back a swept VM's NUMA reservation and host
// identity by its owner key.
type sweepScope struct {
	layout      layout
	conn        sweeper
	fdSocketDir string
	release     func(owner string) error
}

// sweep releases the domains and runtime dirs of s that belong to no live
// VM, and logs each. Errors are logged: the sweep is tried again by the
// next shim.
func sweep(ctx context.Context, s sweepScope, now time.Time) {
	l, conn, fdSocketDir, releaseNUMA := s.layout, s.conn, s.fdSocketDir, s.release
	doms, err := conn.Domains()
	if err != nil {
		log.G(ctx).WithError(err).Warn("sweep: list domains; nothing swept")
		return
	}
	vmsDir := filepath.Join(l.root, "vms")
	referenced := map[string]bool{}
	for name, m := range doms {
		if filepath.Dir(m.StateDir) != vmsDir {
			continue // another state dir's VM (another shim configuration)
		}
		if !ownerGone(m.StateDir, now) {
			referenced[m.StateDir] = true
			continue
		}
		st, stateErr := conn.State(name)
		if stateErr != nil || st.Running {
			referenced[m.StateDir] = true
			continue
		}
		// A pod re-created after a power loss gets its domain name
		// again: if a Create defined it anew since the listing, the name
		// (and its descriptor socket) is a new VM's, not the lost one's.
		// (A shim's own Creates wait for its sweep; this covers another
		// shim's, but for the moment between this read and the
		// undefine.) The lost VM's NUMA reservation is its own either way.
		cur, metadataErr := conn.Metadata(name)
		if metadataErr != nil || cur.StateDir != m.StateDir {
			if metadataErr == nil {
				referenced[cur.StateDir] = true
			}
			if metadataErr == nil || errdefs.IsNotFound(metadataErr) {
				sweepNUMA(ctx, releaseNUMA, name, m.ContainerID)
			}
			continue
		}
		if undefineErr := conn.Undefine(name); undefineErr != nil && !errdefs.IsNotFound(undefineErr) {
			log.G(ctx).WithError(undefineErr).WithField("vm", name).Warn("sweep: undefine a domain of no live VM")
			referenced[m.StateDir] = true
			continue
		}
		if removeErr := os.Remove(netfd.SocketPath(fdSocketDir, name)); removeErr != nil && !errors.Is(removeErr, os.ErrNotExist) {
			log.G(ctx).WithError(removeErr).WithField("vm", name).Warn("sweep: remove a descriptor socket")
		}
		sweepNUMA(ctx, releaseNUMA, name, m.ContainerID)
		log.G(ctx).WithField("vm", name).WithField("container", m.ContainerID).WithField("pod", m.PodUID).
			Info("sweep: undefined the stopped domain of a VM whose shim is gone (lost with its task record, e.g. by a power loss)")
	}
	entries, err := os.ReadDir(vmsDir)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			log.G(ctx).WithError(err).Warn("sweep: read the VMs' runtime dirs")
		}
		return
	}
	for _, e := range entries {
		dir := filepath.Join(vmsDir, e.Name())
		if !e.IsDir() || referenced[dir] || !ownerGone(dir, now) {
			continue
		}
		if err := removeVMDir(dir); err != nil {
			log.G(ctx).WithError(err).WithField("dir", dir).Warn("sweep: remove the runtime dir of no live VM")
			continue
		}
		log.G(ctx).WithField("dir",
			dir).Info("sweep: removed the runtime dir of a VM whose shim and domain are gone (console log, config drive, mounts)")
	}
}

// sweepNUMA gives back the NUMA reservation of a lost VM (domain name,
// container id); release nil places nothing.
func sweepNUMA(ctx context.Context, release func(owner string) error, name, containerID string) {
	if release == nil {
		return
	}
	if err := release(numaOwner(name, containerID)); err != nil {
		log.G(ctx).WithError(err).WithField("vm", name).Warn("sweep: release a NUMA reservation")
	}
}

// removeVMDir unmounts the bind mounts in a VM's runtime dir, then
// removes it. A mount that stays keeps the dir, and so does any other
// mount below it: removing the dir must never reach into a volume's data.
func removeVMDir(dir string) error {
	var errs []error
	for _, b := range readOnlyMounts(dir) {
		if err := vm.Unmount(b); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	left, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return fmt.Errorf("remove %s: list mounts: %w", dir, err)
	}
	if len(left) > 0 {
		return fmt.Errorf("remove %s: %s is still mounted: %w", dir, left[0].Mountpoint, errdefs.ErrFailedPrecondition)
	}
	return os.RemoveAll(dir)
}
