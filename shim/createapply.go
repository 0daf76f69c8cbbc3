package shim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/containerd/containerd/mount"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/faultpoint"
	"github.com/kvm-shim/containerd-shim-kvm-v1/netfd"
	"github.com/kvm-shim/containerd-shim-kvm-v1/numa"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vmplan"
)

// The apply of a VM container's Create: named steps that make what the
// plan decided, each registering its undo as soon as it succeeded, so a
// failure leaves no mount, file, reservation or domain behind (the way
// vm.Render runs its configurators).

// createStep is one named step of the apply; its name times it in the
// Create's log line.
type createStep struct {
	name string
	run  func(context.Context) error
}

// createRun is one apply: its plan, and what its steps made so far.
type createRun struct {
	h    *host
	p    *createPlan
	undo rollback

	rec       taskRecord
	rootfs    string
	src       vm.BootSource
	id        vm.Identity
	own       bool // id is the VM's own, not the shared QEMU user's
	placement *vm.Pinning
	numaJSON  string
	fdHooks   []netfd.ServeOption
	fdServer  *netfd.Server
	spec      vm.Spec
	waitDrive func() error
	maxVCPUs  int        // how many vCPUs the VM may have live
	mem       memorySize // the VM's memory as resize sees it
}

// steps are the apply's steps in order. The rootfs comes first: the one
// check the plan cannot make on a snapshot it would have to mount (how
// the image boots) comes right after it, before anything else is made.
// containerd unmounts a bundle's rootfs itself, so the mount needs no
// record.
func (c *createRun) steps() []createStep {
	return []createStep{
		{"rootfs", c.mountRootfs},
		{"record", c.writeRecord},
		{"numa", c.reserveNUMA},
		{"identity", c.allocateIdentity},
		{"cgroup", c.createCgroup},
		{"vm_dir", c.makeVMDir},
		{"volumes", c.prepareVolumes},
		{"network", c.setupNetwork},
		{"config_drive", c.startConfigDrive},
		{"disk_or_kernel", c.prepareBoot},
		{"define", c.define},
		{"config_drive_wait", func(context.Context) error { return c.waitDrive() }},
	}
}

// applyCreate makes the VM the plan decided and returns its task.
func applyCreate(ctx context.Context, h *host, p *createPlan, ph *phases, publish func(any)) (_ *vmTask, retErr error) {
	c := &createRun{h: h, p: p, rootfs: filepath.Join(p.req.bundle, "rootfs"), waitDrive: func() error { return nil }}
	defer func() {
		if retErr != nil {
			c.undo.run()
		}
	}()
	// Every return waits for the config drive's build first, so a
	// rollback never races it in the VM dir.
	defer func() { _ = c.waitDrive() }()
	for _, s := range c.steps() {
		if err := s.run(ctx); err != nil {
			return nil, err
		}
		ph.mark(s.name)
	}
	set := p.set
	log.G(ctx).WithField("vm", p.name).WithField("accel", h.accel).
		WithField("vcpus", set.vcpus).WithField("memoryMiB", set.memMiB).
		WithField("took", ph.String()).Info("defined VM")
	return &vmTask{proc: newProc(p.req.id, p.req.bundle, p.req.stdio, publish), h: h, rec: c.rec, fdServer: c.fdServer, cgroup: p.cg,
		shares: len(c.spec.Shares), vcpus: set.vcpus, plugged: set.vcpus, memMiB: set.memMiB, maxVCPUs: c.maxVCPUs, mem: c.mem,
		oomScoreAdj: oomScoreAdj(p.req.spec)}, nil
}

// mountRootfs mounts the container's rootfs when it is a snapshot, and
// finds how its image boots if the plan could not look.
func (c *createRun) mountRootfs(ctx context.Context) error {
	if len(c.p.req.rootfs) > 0 {
		if err := os.MkdirAll(c.rootfs, 0o711); err != nil {
			return fmt.Errorf("create rootfs mount point: %w", err)
		}
		if err := mount.All(c.p.req.rootfs, c.rootfs); err != nil {
			return fmt.Errorf("mount container rootfs: %w", err)
		}
		c.undo.add(func() { _ = mount.UnmountAll(c.rootfs, unix.MNT_DETACH) })
	}
	if c.p.src == nil {
		if err := c.p.planBoot(ctx, c.rootfs); err != nil {
			return err
		}
	}
	c.src = *c.p.src
	return nil
}

// writeRecord takes the domain name over and writes the task record. The
// record goes before any other host resource: if this shim dies halfway,
// the cleanup `delete` finds every piece from it.
func (c *createRun) writeRecord(context.Context) error {
	h, p := c.h, c.p
	if p.takeOver {
		if err := h.conn.Undefine(p.name); err != nil {
			return err
		}
	}
	c.rec = taskRecord{
		Kind: kindVM, ID: p.req.id, Namespace: p.ident.Namespace,
		StateDir: h.cfg.StateDir, LibvirtSocket: h.cfg.LibvirtSocket,
		Domain: p.name, VMDir: p.vmDir, PodUID: p.ident.PodUID,
		Overlay: p.overlay, KeepOverlay: p.ident.InPod(),
	}
	if p.ident.InPod() {
		if err := h.layout.ensurePodVMDir(p.ident.PodUID, p.ident.ContainerName); err != nil {
			return err
		}
	}
	if h.numa != nil {
		c.rec.NUMAOwner, c.rec.NUMAStore = numaOwner(p.name, p.req.id), h.cfg.NUMAStateFile
	}
	if h.ids != nil {
		c.rec.IDOwner, c.rec.IDStore, c.rec.IDRange = vmOwner(p.name, p.req.id), h.cfg.VMIDStateFile, h.cfg.VMIDRange
	}
	if err := writeRecord(p.req.bundle, &c.rec); err != nil {
		return fmt.Errorf("write task record: %w", err)
	}
	c.undo.add(func() { _ = removeRecord(p.req.bundle) })
	return nil
}

// reserveNUMA places the VM on the node's NUMA nodes.
func (c *createRun) reserveNUMA(context.Context) error {
	if c.h.numa == nil {
		return nil
	}
	set := c.p.set
	pl, err := c.h.numa.Reserve(numa.Request{Owner: c.rec.NUMAOwner, VCPUs: set.vcpus, MemoryMiB: set.memMiB, Mode: set.numaMode})
	if errdefs.IsResourceExhausted(err) {
		return fmt.Errorf("%w (under Kubernetes this VM takes %s of the node's %s: the RuntimeClass's overhead requests 1, "+
			"the VM container the rest)", err, slotsOf(c.h.numa.Policy(), set.numaMode, set.vcpus), numa.VCPUResource)
	}
	if err != nil {
		return err
	}
	c.undo.add(func() { _ = c.h.numa.Release(c.rec.NUMAOwner) })
	b, _ := json.Marshal(pl)
	c.placement, c.numaJSON = vmplan.Pinning(pl), string(b)
	return nil
}

// slotsOf says how many of the node's numa.VCPUResource a VM takes.
func slotsOf(p numa.Policy, mode numa.Mode, vcpus int) string {
	n, err := numa.VCPUSlots(p, mode, vcpus)
	if err != nil {
		return "?"
	}
	return strconv.Itoa(n)
}

// allocateIdentity gives the VM its host identity and the pod's VM data
// dir to it.
func (c *createRun) allocateIdentity(context.Context) error {
	var err error
	if c.id, c.own, err = c.h.allocateIdentity(c.rec.IDOwner); err != nil {
		return err
	}
	if c.own {
		c.undo.add(func() { _ = c.h.ids.Release(c.rec.IDOwner) })
		c.rec.Identity = &c.id
		if err := writeRecord(c.p.req.bundle, &c.rec); err != nil {
			return fmt.Errorf("write task record: %w", err)
		}
	}
	if c.p.ident.InPod() {
		// The pod's VM data outlives this container; it is this VM's
		// while the VM lives (and root's again after, see releaseVM).
		return giveToVM(filepath.Dir(c.rec.Overlay), c.id, 0o700)
	}
	return nil
}

// createCgroup makes the VM's cgroup below the pod's.
func (c *createRun) createCgroup(context.Context) error {
	cg := c.p.cg
	if cg == nil {
		return nil
	}
	if err := createVMCgroup(cg, &c.rec, c.p.req.bundle, &c.undo); err != nil {
		return err
	}
	c.fdHooks = append(c.fdHooks, netfd.WithPeerHook(func(pid int) error { return joinVMCgroup(cg, pid) }))
	return nil
}

// makeVMDir makes the VM's runtime dir, the VM's alone, marked in use.
func (c *createRun) makeVMDir(ctx context.Context) error {
	vmDir := c.p.vmDir
	if err := os.MkdirAll(vmDir, 0o700); err != nil {
		return fmt.Errorf("create VM dir: %w", err)
	}
	c.undo.add(func() { _ = os.RemoveAll(vmDir) })
	if err := giveToVM(vmDir, c.id, 0o700); err != nil {
		return err
	}
	// The owner file tells the sweep of another shim that this dir is in
	// use while no domain refers to it yet.
	if err := writeMarker(filepath.Join(vmDir, ownerFile)); err != nil {
		return err
	}
	c.spec = c.domainSpec(log.G(ctx))
	return nil
}

// prepareVolumes gives the VM the pod's volumes.
func (c *createRun) prepareVolumes(ctx context.Context) error {
	a := &volumeApply{h: c.h, vmDir: c.p.vmDir, id: c.id, undo: &c.undo}
	gv, err := a.prepareVolumes(ctx, c.p.vols)
	if err != nil {
		return err
	}
	c.spec.VolumeDisks, c.spec.Shares, c.spec.VirtiofsBinary = gv.disks, gv.shares, c.h.cfg.Virtiofsd
	return nil
}

// setupNetwork takes the pod network over for the VM. Each step is in
// the record before it is taken: the cleanup after a shim crash in the
// middle finds the TAP and the wiring.
func (c *createRun) setupNetwork(ctx context.Context) error {
	if c.p.net == nil {
		return nil
	}
	record := func(n *vmNetwork) error {
		c.rec.Network = n
		if err := writeRecord(c.p.req.bundle, &c.rec); err != nil {
			return fmt.Errorf("write task record: %w", err)
		}
		return nil
	}
	srv, err := setupNetwork(ctx, c.h, c.p.net, netSetup{domain: c.p.name, key: c.p.ident.RuntimeKey(), vcpus: c.p.set.vcpus, id: c.id,
		record: record, undo: &c.undo, fdOpts: c.fdHooks})
	if err != nil {
		return err
	}
	c.fdServer = srv
	c.spec.Emulator = c.h.cfg.QEMUWrapper
	return nil
}

// startConfigDrive builds the config drive while the disk or kernel is
// prepared and the domain defined.
func (c *createRun) startConfigDrive(ctx context.Context) error {
	if c.p.drive == nil {
		return nil
	}
	cd, id := c.p.drive, c.id
	c.spec.ConfigDrive = cd
	errc := make(chan error, 1)
	build := func() error {
		if err := c.p.buildDrive(); err != nil {
			return err
		}
		return giveToVM(cd.Path, id, 0o600)
	}
	go func() {
		buildErr := errors.New("config drive build did not finish")
		if perr := callSafe(ctx, "build the config drive", func() { buildErr = build() }); perr != nil {
			buildErr = perr
		}
		errc <- buildErr
	}()
	c.waitDrive = sync.OnceValue(func() error { return <-errc })
	return nil
}

// prepareBoot gives the VM its boot disk or its kernel.
func (c *createRun) prepareBoot(ctx context.Context) error {
	if c.src.Disk != "" {
		disk, err := c.prepareDisk(ctx)
		if err != nil {
			return err
		}
		if err := giveToVM(disk.Path, c.id, 0o600); err != nil {
			return err
		}
		c.spec.Disk = disk
		return nil
	}
	kernel, err := c.prepareKernel()
	if err != nil {
		return err
	}
	c.spec.Kernel = kernel
	return nil
}

// define renders the domain and defines it in libvirt.
func (c *createRun) define(context.Context) error {
	domainXML, err := vm.Render(&c.spec)
	if err != nil {
		return err
	}
	if err := c.h.conn.Define(domainXML); err != nil {
		return err
	}
	c.undo.add(func() { _ = c.h.conn.Undefine(c.p.name) })
	faultpoint.Hold(faultpoint.Defined)
	return nil
}

// domainSpec is the domain as far as the plan, the NUMA placement and
// the identity say; the later steps add devices.
func (c *createRun) domainSpec(l *log.Entry) vm.Spec {
	h, p, set := c.h, c.p, c.p.set
	spec := vm.Spec{
		Name: p.name, UUID: p.ident.UUID(),
		VCPUs: set.vcpus, MemoryMiB: set.memMiB,
		Accel: h.accel, Emulator: h.cfg.QEMUBinary, Machine: h.cfg.Machine,
		Console: vm.Console{Socket: filepath.Join(p.vmDir, "console.sock"), Log: filepath.Join(p.vmDir, "console.log")},
		Meta: vm.Metadata{
			SandboxID: p.ident.SandboxID, ContainerID: p.req.id, Namespace: p.ident.Namespace,
			PodUID: p.ident.PodUID, PodName: p.ident.PodName, PodNamespace: p.ident.PodNamespace,
			ContainerName: p.ident.ContainerName, StateDir: p.vmDir, NUMA: c.numaJSON,
		},
		Pinning:     c.placement,
		Identity:    ownIdentity(c.id, c.own),
		HugePageKiB: set.pageKiB,
		MaxVCPUs:    set.maxVCPUs,
	}
	if set.maxMemMiB > set.memMiB {
		spec.MaxMemoryMiB = set.maxMemMiB
	}
	if c.placement != nil && len(c.placement.VCPUPins) > 0 && set.maxVCPUs > set.vcpus {
		// Spread over nodes: each vCPU is pinned to its guest cell.
		l.WithField("vm", p.name).Info("VM spans NUMA nodes: no vCPUs can be added live")
		spec.MaxVCPUs = 0
	}
	c.maxVCPUs = max(spec.MaxVCPUs, set.vcpus)
	if c.placement != nil && len(c.placement.Cells) > 1 && spec.MaxMemoryMiB > 0 {
		// Its memory is split over fixed guest cells, one per node.
		l.WithField("vm", p.name).Info("VM spans NUMA nodes: no memory can be added live")
		spec.MaxMemoryMiB = 0
	}
	c.mem = memorySize{bootMiB: set.memMiB, maxMiB: set.memMiB + vm.HotplugMemoryMiB(&spec), blockMiB: int(vm.MemoryBlockKiB(&spec) / 1024)}
	return spec
}
