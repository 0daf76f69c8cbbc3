package shim

import (
	"context"
	"errors"
	"fmt"

	cgroup1stats "github.com/containerd/cgroups/v3/cgroup1/stats"
	cgroup2stats "github.com/containerd/cgroups/v3/cgroup2/stats"
	"github.com/containerd/containerd/protobuf"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kvm-shim/containerd-shim-kvm-v1/cgroup"
)

// A VM's QEMU is charged to its container's cgroup (the OCI spec's
// linux.cgroupsPath, below the pod cgroup kubelet made): memory, CPU and
// pids. The shim creates the cgroup at Create, as runc would, and moves
// QEMU in before it runs guest code:
//
//   - VMs with a pod network: in the descriptor handoff, while the
//     emulator wrapper waits for its descriptors, before it execs QEMU.
//     The pid is the authorized peer's (libvirt's pid for the domain), the
//     path the shim's own: nothing the guest or the QEMU user can name.
//     Every allocation of QEMU is the pod's.
//   - VMs without a network (no wrapper): at Start, while the domain is
//     still paused. What QEMU allocated before (a few MiB of its own
//     heap) stays charged where libvirt started it: Linux 6.x moves no
//     charges.
//
// libvirt must not manage the memory, cpu, cpuacct or pids controllers
// (qemu.conf cgroup_controllers; `check` verifies it), or it would move
// vCPU threads out of the pod again; on cgroup v1 it keeps cpuset (the
// numatune binding) and devices. The cgroup is removed at Delete.

// vmCgroup returns the container's cgroup from its spec, checked; nil when
// the spec names none, or names a systemd scope (logged: QEMU then stays
// in libvirt's cgroup), or the host has no usable cgroups.
func vmCgroup(ctx context.Context, h *host, spec *specs.Spec) (*cgroup.Group, error) {
	if spec.Linux == nil || spec.Linux.CgroupsPath == "" {
		log.G(ctx).Info("the spec names no cgroupsPath: QEMU stays in libvirt's cgroup")
		return nil, nil
	}
	p := spec.Linux.CgroupsPath
	if _, err := cgroup.CleanPath(p); errors.Is(err, cgroup.ErrSystemdPath) {
		h.warnOnce("cgroup-systemd",
			fmt.Sprintf("cgroupsPath %q is for the systemd cgroup driver, which this shim does not support: QEMU stays in libvirt's cgroup and "+
				"the pod's limits do not cover it (use the cgroupfs driver)", p))
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("linux.cgroupsPath: %w", err)
	}
	if h.cgroups == nil {
		h.warnOnce("cgroup-none", "no usable cgroup hierarchies on this host: QEMU stays in libvirt's cgroup")
		return nil, nil
	}
	return h.cgroups.Group(p)
}

// createVMCgroup makes the VM's cgroup, records it before, and registers
// its removal on undo when it is new.
func createVMCgroup(g *cgroup.Group, rec *taskRecord, bundle string, undo *rollback) error {
	rec.Cgroup = g.Path
	if err := writeRecord(bundle, rec); err != nil {
		return fmt.Errorf("write task record: %w", err)
	}
	created, err := g.Create()
	if created {
		undo.add(func() { _ = g.Remove() })
	}
	if err != nil {
		return err
	}
	rec.CgroupCreated = created
	return writeRecord(bundle, rec)
}

// joinVMCgroup moves QEMU into the VM's cgroup; the domain must not
// start its vCPUs when that fails.
func joinVMCgroup(g *cgroup.Group, pid int) error {
	if g == nil {
		return nil
	}
	if err := g.Join(pid); err != nil {
		return fmt.Errorf("charge QEMU to the pod: %w", err)
	}
	return nil
}

// chargeVirtiofsd moves the virtiofsd daemons libvirt started for the
// VM's shares (and their sandbox children) into the VM's cgroup, before
// the guest runs: they serve the pod's volumes and are the pod's cost.
// libvirt starts them in its own cgroups, outside the pod.
func (t *vmTask) chargeVirtiofsd(ctx context.Context) error {
	if t.cgroup == nil || t.shares == 0 {
		return nil
	}
	daemons, pids, err := t.h.conn.VirtiofsdPIDs(t.rec.Domain)
	if err != nil {
		return fmt.Errorf("find the VM's virtiofsd: %w", err)
	}
	if len(daemons) != t.shares {
		return fmt.Errorf("found %d virtiofsd daemons for %d shares of domain %s: %w", len(daemons), t.shares, t.rec.Domain,
			errdefs.ErrFailedPrecondition)
	}
	for _, pid := range pids {
		if err := t.cgroup.Join(pid); err != nil {
			return fmt.Errorf("charge virtiofsd to the pod: %w", err)
		}
	}
	log.G(ctx).WithField("vm", t.rec.Domain).WithField("pids", pids).Info("virtiofsd charged to the pod's cgroup")
	return nil
}

// removeVMCgroup removes the cgroup the record says this task created
// (also for the cleanup after a shim crash, which has no host).
func removeVMCgroup(rec *taskRecord) error {
	if rec.Cgroup == "" || !rec.CgroupCreated {
		return nil
	}
	h, err := cgroup.Detect()
	if err != nil {
		return err
	}
	g, err := h.Group(rec.Cgroup)
	if err != nil {
		return err
	}
	return g.Remove()
}

// cgroupStats reports the statistics of a running VM's cgroup.
func (t *vmTask) cgroupStats(ctx context.Context) (*anypb.Any, error) {
	if err := t.allow(stepStats); err != nil {
		return nil, err
	}
	return cgroupMetrics(t.cgroup)
}

// cgroupMetrics reports the VM's cgroup (QEMU with its overhead) in the
// metrics type of the host's cgroup version, which CRI decodes by type.
func cgroupMetrics(g *cgroup.Group) (*anypb.Any, error) {
	st, err := g.Stats()
	if err != nil {
		return nil, fmt.Errorf("stats of %s: %w", g.Path, errors.Join(err, errdefs.ErrUnavailable))
	}
	var m any
	if st.Version == 2 {
		m = metricsV2(st)
	} else {
		m = metricsV1(st)
	}
	a, err := typeurl.MarshalAny(m)
	if err != nil {
		return nil, err
	}
	return protobuf.FromAny(a), nil
}

func metricsV1(st cgroup.Stats) *cgroup1stats.Metrics {
	s := st.Memory
	return &cgroup1stats.Metrics{
		Pids: &cgroup1stats.PidsStat{Current: st.PidsCurrent, Limit: st.PidsLimit},
		CPU: &cgroup1stats.CPUStat{
			Usage: &cgroup1stats.CPUUsage{Total: st.CPUUsageNs, User: st.CPUUserNs, Kernel: st.CPUSystemNs},
			Throttling: &cgroup1stats.Throttle{
				Periods: st.CPU["nr_periods"], ThrottledPeriods: st.CPU["nr_throttled"], ThrottledTime: st.CPU["throttled_time"],
			},
		},
		Memory: &cgroup1stats.MemoryStat{
			Cache: s["cache"], RSS: s["rss"], RSSHuge: s["rss_huge"], MappedFile: s["mapped_file"],
			Dirty: s["dirty"], Writeback: s["writeback"], PgPgIn: s["pgpgin"], PgPgOut: s["pgpgout"],
			PgFault: s["pgfault"], PgMajFault: s["pgmajfault"],
			InactiveAnon: s["inactive_anon"], ActiveAnon: s["active_anon"],
			InactiveFile: s["inactive_file"], ActiveFile: s["active_file"], Unevictable: s["unevictable"],
			HierarchicalMemoryLimit: s["hierarchical_memory_limit"], HierarchicalSwapLimit: s["hierarchical_memsw_limit"],
			TotalCache: s["total_cache"], TotalRSS: s["total_rss"], TotalRSSHuge: s["total_rss_huge"],
			TotalMappedFile: s["total_mapped_file"], TotalDirty: s["total_dirty"], TotalWriteback: s["total_writeback"],
			TotalPgPgIn: s["total_pgpgin"], TotalPgPgOut: s["total_pgpgout"],
			TotalPgFault: s["total_pgfault"], TotalPgMajFault: s["total_pgmajfault"],
			TotalInactiveAnon: s["total_inactive_anon"], TotalActiveAnon: s["total_active_anon"],
			TotalInactiveFile: s["total_inactive_file"], TotalActiveFile: s["total_active_file"],
			TotalUnevictable: s["total_unevictable"],
			Usage: &cgroup1stats.MemoryEntry{Usage: st.MemoryUsage, Limit: st.MemoryLimit, Max: st.MemoryMaxUsage,
				Failcnt: st.MemoryFailcnt},
		},
	}
}

func metricsV2(st cgroup.Stats) *cgroup2stats.Metrics {
	s, e := st.Memory, st.MemoryEvents
	return &cgroup2stats.Metrics{
		Pids: &cgroup2stats.PidsStat{Current: st.PidsCurrent, Limit: st.PidsLimit},
		CPU: &cgroup2stats.CPUStat{
			UsageUsec: st.CPU["usage_usec"], UserUsec: st.CPU["user_usec"], SystemUsec: st.CPU["system_usec"],
			NrPeriods: st.CPU["nr_periods"], NrThrottled: st.CPU["nr_throttled"], ThrottledUsec: st.CPU["throttled_usec"],
		},
		Memory: &cgroup2stats.MemoryStat{
			Anon: s["anon"], File: s["file"], KernelStack: s["kernel_stack"], Slab: s["slab"], Sock: s["sock"],
			Shmem: s["shmem"], FileMapped: s["file_mapped"], FileDirty: s["file_dirty"], FileWriteback: s["file_writeback"],
			AnonThp: s["anon_thp"], InactiveAnon: s["inactive_anon"], ActiveAnon: s["active_anon"],
			InactiveFile: s["inactive_file"], ActiveFile: s["active_file"], Unevictable: s["unevictable"],
			SlabReclaimable: s["slab_reclaimable"], SlabUnreclaimable: s["slab_unreclaimable"],
			Pgfault: s["pgfault"], Pgmajfault: s["pgmajfault"],
			Usage: st.MemoryUsage, UsageLimit: st.MemoryLimit,
		},
		MemoryEvents: &cgroup2stats.MemoryEvents{Low: e["low"], High: e["high"], Max: e["max"], Oom: e["oom"], OomKill: e["oom_kill"]},
	}
}
