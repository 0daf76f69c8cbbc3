package shim

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/containerd/log"

	"github.com/kvm-shim/containerd-shim-kvm-v1/cgroup"
	"github.com/kvm-shim/containerd-shim-kvm-v1/config"
	"github.com/kvm-shim/containerd-shim-kvm-v1/hostid"
	"github.com/kvm-shim/containerd-shim-kvm-v1/netfd"
	"github.com/kvm-shim/containerd-shim-kvm-v1/numa"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// host is what all VM tasks of one shim share: the configuration, the
// acceleration chosen for this host, and one libvirt connection.
type host struct {
	cfg    config.Config
	accel  vm.Accel
	conn   domains
	events <-chan vm.Event
	close  func() error
	layout layout

	// The QEMU user, the only one allowed to fetch network descriptors
	// from sockets under fdSocketDir.
	qemuUID, qemuGID int
	fdSocketDir      string

	// numa holds the node's NUMA reservations, shared with every other
	// shim on the node; nil places nothing (unit tests).
	numa *numa.Store

	// ids hands out the VMs' host identities, shared with every other
	// shim on the node; nil runs every VM as the QEMU user.
	ids *hostid.Store

	// cgroups are the host's cgroup hierarchies a VM is charged to; nil
	// charges nothing (no usable cgroups, unit tests).
	cgroups *cgroup.Hierarchies

	warned sync.Map // what warnOnce already said
}

// warnOnce logs a warning the first time key comes up in this shim.
func (h *host) warnOnce(key, msg string) {
	if _, seen := h.warned.LoadOrStore(key, true); !seen {
		log.L.Warn(msg)
	}
}

// domains is what the VM tasks need of libvirt; *vm.Conn in production,
// a fake with state in unit tests.
type domains interface {
	Define(domainXML []byte) error
	Start(name string, paused bool) error
	Resume(name string) error
	Suspend(name string) error
	Shutdown(name string) error
	Destroy(name string) error
	Undefine(name string) error
	State(name string) (vm.State, error)
	Stats(name string) (vm.Stats, error)
	Metadata(name string) (vm.Metadata, error)
	PID(name string) (int, error)
	WatchExit(name string, pid int) (*vm.ExitWatch, error)
	Reconnects() uint64
	Connected() bool
	VirtiofsdPIDs(name string) (daemons, all []int, err error)
	vm.AgentCommander
	SetVCPUs(name string, n int) error
	VCPUs(name string) (int, error)
	SetGuestVCPUs(name string, n int, timeout time.Duration) error
	GuestVCPUs(name string) (int, error)
	RequestMemory(name string, mib int, timeout time.Duration) (vm.PluggedMemory, error)
	Plugged(name string) (vm.PluggedMemory, error)
	Domains() (map[string]vm.Metadata, error)
	Identity(name string) (*vm.Identity, error)
}

var _ domains = (*vm.Conn)(nil)

func newHost(ctx context.Context, cfg config.Config, kvm vm.KVMInfo) (*host, error) {
	accel, warning, err := vm.ChooseAccel(cfg.Accel, kvm)
	if err != nil {
		return nil, err
	}
	if warning != "" {
		log.G(ctx).Warn(warning)
	}
	l := layout{root: cfg.StateDir}
	if err = l.ensure(); err != nil {
		return nil, err
	}
	// The console socket path must fit a sockaddr_un.
	if sock := filepath.Join(l.vmDir("0123456789ab"), "console.sock"); len(sock) > 107 {
		return nil, fmt.Errorf("state_dir %s is too long: socket paths under it would exceed 107 bytes", l.root)
	}
	if err = CheckSearchable(l.root); err != nil {
		return nil, err
	}
	uid, gid, err := lookupQEMUUser(cfg.QEMUUser)
	if err != nil {
		return nil, err
	}
	store, err := OpenNUMA(cfg)
	if err != nil {
		return nil, err
	}
	ids, err := openIDs(cfg)
	if err != nil {
		return nil, err
	}
	if ids != nil {
		if dirsErr := searchableLibvirtDirs(ctx, LibvirtDomainDirs); dirsErr != nil {
			return nil, dirsErr
		}
	}
	vc, err := vm.Connect(ctx, cfg.LibvirtSocket)
	if err != nil {
		return nil, err
	}
	conn := newBoundedDomains(vc)
	if err := reconcileNUMA(ctx, store, conn.Domains); err != nil {
		log.G(ctx).WithError(err).Warn("reconcile NUMA reservations")
	}
	if ids != nil {
		if err := reconcileIDs(ctx, ids, conn); err != nil {
			log.G(ctx).WithError(err).Warn("reconcile the VMs' host identities")
		}
	}
	var cgroups *cgroup.Hierarchies
	if hs, err := cgroup.Detect(); err != nil {
		log.G(ctx).WithError(err).Warn("no usable cgroups: VMs are not charged to their pods")
	} else {
		cgroups = &hs
	}
	return &host{
		cfg: cfg, accel: accel, conn: conn, events: vc.Events(), close: vc.Close, layout: l,
		qemuUID: uid, qemuGID: gid, fdSocketDir: netfd.SocketDir, numa: store, ids: ids, cgroups: cgroups,
	}, nil
}

// CheckSearchable makes sure QEMU, which runs as an unprivileged user, can
// reach files under dir: every directory on the way needs o+x.
func CheckSearchable(dir string) error {
	for d := dir; ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("state_dir %s: %w", dir, err)
		}
		if st.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("state_dir %s: %s (mode %#o) is not searchable by the QEMU user; give it o+x or choose another state_dir", dir, d,
				st.Mode().Perm())
		}
		if d == "/" {
			return nil
		}
	}
}
