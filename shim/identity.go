package shim

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/kvm-shim/containerd-shim-kvm-v1/config"
	"github.com/kvm-shim/containerd-shim-kvm-v1/hostid"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// Each VM's QEMU runs under a host uid and gid of its own (package
// hostid), recorded in its domain as a static DAC label; the files the
// shim makes for the VM are that identity's alone (modes 0600 and 0700),
// so neither another VM's QEMU nor a local user can open them. With
// vm_id_range = "" every VM runs as qemu_user, as libvirt does by default.

// vmOwner names what a VM holds in the node's shared stores (its NUMA
// reservation and its host identity): the domain and the container, so
// the cleanup of an old container never releases its successor's.
func vmOwner(domain, containerID string) string { return domain + "/" + containerID }

// openIDs opens the node's store of per-VM identities; nil when the
// config turns them off.
func openIDs(cfg config.Config) (*hostid.Store, error) {
	if cfg.VMIDRange == "" {
		return nil, nil
	}
	r, err := hostid.ParseRange(cfg.VMIDRange)
	if err != nil {
		return nil, fmt.Errorf("vm_id_range: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(cfg.VMIDStateFile), 0o711); err != nil {
		return nil, fmt.Errorf("create id state dir: %w", err)
	}
	return hostid.OpenStore(cfg.VMIDStateFile, r)
}

// identityLister is what the reconcile needs of libvirt.
type identityLister interface {
	Domains() (map[string]vm.Metadata, error)
	Identity(name string) (*vm.Identity, error)
}

// reconcileIDs rebuilds the node's identities from the static DAC labels
// of the domains libvirt knows (listed under the store's lock), so a shim
// that crashed between allocating and releasing leaks none.
func reconcileIDs(ctx context.Context, store *hostid.Store, conn identityLister) error {
	dropped, err := store.ReconcileWith(func() (map[string]uint32, error) {
		doms, err := conn.Domains()
		if err != nil {
			return nil, fmt.Errorf("list domains: %w", err)
		}
		live := make(map[string]uint32, len(doms))
		for name, m := range doms {
			id, err := conn.Identity(name)
			if errdefs.IsNotFound(err) {
				continue // undefined since the listing
			}
			if err != nil {
				return nil, err
			}
			if id != nil && store.Range().Contains(id.UID) {
				live[vmOwner(name, m.ContainerID)] = id.UID
			}
		}
		return live, nil
	})
	if len(dropped) > 0 {
		log.G(ctx).WithField("owners", dropped).Info("freed the host identities of VMs that are gone")
	}
	return err
}

// allocateIdentity gives a VM its identity (uid and gid of one number),
// or the shared QEMU user's when per-VM identities are off.
func (h *host) allocateIdentity(owner string) (vm.Identity, bool, error) {
	if h.ids == nil {
		return vm.Identity{UID: uint32(h.qemuUID), GID: uint32(h.qemuGID)}, false, nil
	}
	id, err := h.ids.Allocate(owner)
	if err != nil {
		return vm.Identity{}, false, err
	}
	return vm.Identity{UID: id, GID: id}, true, nil
}

// releaseIdentity frees the VM's identity as its record names it.
func releaseIdentity(rec *taskRecord) error {
	if rec.IDOwner == "" {
		return nil
	}
	r, err := hostid.ParseRange(rec.IDRange)
	if err != nil {
		return err
	}
	store, err := hostid.OpenStore(rec.IDStore, r)
	if err != nil {
		return err
	}
	return store.Release(rec.IDOwner)
}

// giveToVM makes path the VM's alone: owned by its identity, mode perm
// (0600 for files, 0700 for dirs). It does not follow a final symlink.
func giveToVM(path string, id vm.Identity, perm fs.FileMode) error {
	if err := os.Lchown(path, int(id.UID), int(id.GID)); err != nil {
		return fmt.Errorf("give %s to the VM's uid %d: %w", path, id.UID, err)
	}
	if err := os.Chmod(path, perm); err != nil {
		return fmt.Errorf("give %s to the VM's uid %d: %w", path, id.UID, err)
	}
	return nil
}

// takeBack gives what outlives a VM (the pod's overlay and its dir) back
// to root, so the next VM given the freed identity id finds nothing of
// this one. A path another identity owns by now (the pod's next VM took
// it over) is left alone.
func takeBack(id *vm.Identity, paths ...string) error {
	if id == nil {
		return nil
	}
	var errs []error
	for _, p := range paths {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("stat %s: %w", p, err))
			}
			continue
		}
		if st.Uid != id.UID {
			continue
		}
		if err := os.Lchown(p, 0, 0); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// LibvirtDomainDirs hold each running domain's private dir (master key,
// agent and monitor sockets), made by libvirt for the domain's label. A
// QEMU under its own uid must search them: Debian makes them 0750 of
// libvirt-qemu, upstream's packaging 0751.
var LibvirtDomainDirs = []string{"/var/lib/libvirt/qemu", "/var/lib/libvirt/qemu/channel", "/var/lib/libvirt/qemu/channel/target"}

// searchableLibvirtDirs gives libvirt's domain dirs o+x where they lack it.
// A dir that does not exist is libvirt's to make.
func searchableLibvirtDirs(ctx context.Context, dirs []string) error {
	for _, d := range dirs {
		st, err := os.Stat(d)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if st.Mode().Perm()&0o001 != 0 {
			continue
		}
		if err := os.Chmod(d, st.Mode().Perm()|0o001); err != nil {
			return fmt.Errorf("let per-VM QEMU users search %s: %w", d, err)
		}
		log.G(ctx).WithField("dir",
			d).Info("gave libvirt's domain dir o+x: each VM's QEMU runs under its own uid and must reach its domain's dir below it")
	}
	return nil
}

// releaseHeld gives back what a lost VM (by its owner key) holds in the
// node's shared stores: its NUMA reservation and its host identity.
func (h *host) releaseHeld(owner string) error {
	var errs []error
	if h.numa != nil {
		errs = append(errs, h.numa.Release(owner))
	}
	if h.ids != nil {
		errs = append(errs, h.ids.Release(owner))
	}
	return errors.Join(errs...)
}
