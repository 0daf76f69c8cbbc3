package shim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/mount"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/kvm-shim/containerd-shim-kvm-v1/cgroup"
	"github.com/kvm-shim/containerd-shim-kvm-v1/configdrive"
	"github.com/kvm-shim/containerd-shim-kvm-v1/netfd"
	"github.com/kvm-shim/containerd-shim-kvm-v1/numa"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// vmTask is a container that runs as a libvirt domain. Its pid is QEMU's.
type vmTask struct {
	proc
	h        *host
	rec      taskRecord
	console  *console      // guarded by mu
	fdServer *netfd.Server // hands the VM's network descriptors to its QEMU; nil without network
	cgroup   *cgroup.Group // QEMU's cgroup (the pod's); nil for none
	shares   int           // virtiofs shares: libvirt runs a virtiofsd for each

	powerOffOnResume bool // guarded by mu: a SIGTERM came while paused
	// powerPressed: the ACPI power button was pressed (a shutdown was
	// asked). Guarded by mu.
	powerPressed bool
	// pressReconnects is the libvirt connection's reconnect count read
	// just before the press: a higher count later means libvirtd was
	// away since (see onStopped). Guarded by mu.
	pressReconnects uint64
	// launched: the Start finished, the VM ran (set with RUNNING, never
	// cleared). Read without mu by resync, which must not wait for a
	// Start in flight before it asks libvirt.
	launched atomic.Bool

	agent         *vm.Agent               // guarded by mu; the guest agent client, from Start
	exit          *vm.ExitWatch           // guarded by mu; QEMU's exit, from Start
	execs         map[string]*execProcess // guarded by mu; by exec id
	vcpus, memMiB int                     // guarded by mu: the VM's size now (vCPUs online in the guest)
	plugged       int                     // guarded by mu: QEMU's vCPUs, the online ones and those the guest took offline
	maxVCPUs      int                     // what vcpus may grow to live; set at create
	mem           memorySize              // boot, maximum and block of the VM's memory; set at create
	resizeMu      sync.Mutex              // serializes update
}

// createRequest is the part of a task create the VM needs.
type createRequest struct {
	id, bundle string
	rootfs     []mount.Mount
	stdio      stdio
	spec       *specs.Spec
	netns      string // the pod's network namespace; "" for no network
	// podNet is the pod network its sandbox saw; nil when none was
	// recorded (no sandbox in this shim, or it could not look).
	podNet *netfd.PodNetwork
	// took times the Create for its log line, from when the request got
	// the shim's create lock; nil starts the timing in createVMTask.
	took *phases
}

// vmSettings is everything a VM container asks for, read from its OCI
// spec and annotations and checked before anything is created.
type vmSettings struct {
	vcpus, memMiB int
	maxVCPUs      int // live vCPU hotplug up to this
	maxMemMiB     int // live memory hot-add up to this
	cmdline       string
	numaMode      numa.Mode
	pageKiB       uint64
	drive         configdrive.Options
}

func vmSettingsFrom(spec *specs.Spec, cfg Config, io stdio) (vmSettings, error) {
	var s vmSettings
	var err error
	if s.vcpus, s.memMiB, err = vmSize(spec, cfg); err != nil {
		return s, err
	}
	if s.cmdline, err = kernelCmdline(spec, cfg); err != nil {
		return s, err
	}
	if err := checkStdio(io); err != nil {
		return s, err
	}
	if s.numaMode, err = numaMode(spec, cfg); err != nil {
		return s, err
	}
	if s.maxVCPUs, err = hotplugMaxVCPUs(spec, cfg, s.vcpus, s.numaMode); err != nil {
		return s, err
	}
	if s.pageKiB, err = hugePageKiB(spec); err != nil {
		return s, err
	}
	if pageMiB := int(s.pageKiB / 1024); pageMiB > 1 {
		s.memMiB = (s.memMiB + pageMiB - 1) / pageMiB * pageMiB
	}
	if s.maxMemMiB, err = hotplugMaxMemoryMiB(spec, cfg, s.memMiB, s.numaMode); err != nil {
		return s, err
	}
	if s.drive, err = configdrive.FromAnnotations(spec.Annotations, configdrive.Format(cfg.ConfigDriveFormat)); err != nil {
		return s, err
	}
	return s, nil
}

// createVMTask validates the request, then prepares and defines the
// domain. Each step's undo is registered as soon as the step succeeds, so a
// failure leaves no mount, file or domain behind.
func createVMTask(ctx context.Context, h *host, r createRequest, ident vmIdentity, publish func(any)) (_ *vmTask, retErr error) {
	// Input checks first: nothing is created for a request that is wrong.
	ph := r.took
	if ph == nil {
		ph = newPhases()
	}
	set, err := vmSettingsFrom(r.spec, h.cfg, r.stdio)
	if err != nil {
		return nil, err
	}
	cg, err := vmCgroup(ctx, h, r.spec)
	if err != nil {
		return nil, err
	}
	vols, err := classifyVolumes(ctx, r.spec)
	if err != nil {
		return nil, err
	}
	diskSizes, err := diskImageSizes(r.spec)
	if err != nil {
		return nil, err
	}
	ph.mark("checks")
	name := ident.DomainName()
	if err := takeOverDomainName(h.conn, name, ident.ContainerID); err != nil {
		return nil, err
	}

	var undo rollback
	defer func() {
		if retErr != nil {
			undo.run()
		}
	}()

	vmDir := h.layout.vmDir(ident.runtimeKey())
	rec := taskRecord{
		Kind: kindVM, ID: r.id, Namespace: ident.Namespace,
		StateDir: h.cfg.StateDir, LibvirtSocket: h.cfg.LibvirtSocket,
		Domain: name, VMDir: vmDir, PodUID: ident.PodUID,
	}
	if ident.inPod() {
		if err := h.layout.ensurePodVMDir(ident.PodUID, ident.ContainerName); err != nil {
			return nil, err
		}
		rec.Overlay = filepath.Join(h.layout.podVMDir(ident.PodUID, ident.ContainerName), "overlay.qcow2")
		rec.KeepOverlay = true
	} else {
		rec.Overlay = filepath.Join(vmDir, "overlay.qcow2")
	}
	if h.numa != nil {
		rec.NUMAOwner, rec.NUMAStore = numaOwner(name, r.id), h.cfg.NUMAStateFile
	}
	// The record goes first: if this shim dies halfway, the cleanup
	// `delete` finds every piece from it.
	if err := writeRecord(r.bundle, &rec); err != nil {
		return nil, fmt.Errorf("write task record: %w", err)
	}
	undo.add(func() { _ = removeRecord(r.bundle) })

	var placement *vm.Pinning
	var placementJSON string
	if h.numa != nil {
		p, err := h.numa.Reserve(numa.Request{Owner: rec.NUMAOwner, VCPUs: set.vcpus, MemoryMiB: set.memMiB, Mode: set.numaMode})
		if err != nil {
			return nil, err
		}
		undo.add(func() { _ = h.numa.Release(rec.NUMAOwner) })
		b, _ := json.Marshal(p)
		placement, placementJSON = pinning(p), string(b)
	}

	var fdHooks []netfd.ServeOption
	if cg != nil {
		if err := createVMCgroup(cg, &rec, r.bundle, &undo); err != nil {
			return nil, err
		}
		fdHooks = append(fdHooks, netfd.WithPeerHook(func(pid int) error { return joinVMCgroup(cg, pid) }))
	}

	ph.mark("record_and_numa")
	rootfs := filepath.Join(r.bundle, "rootfs")
	if len(r.rootfs) > 0 {
		if err := os.MkdirAll(rootfs, 0o711); err != nil {
			return nil, fmt.Errorf("create rootfs mount point: %w", err)
		}
		if err := mount.All(r.rootfs, rootfs); err != nil {
			return nil, fmt.Errorf("mount container rootfs: %w", err)
		}
		undo.add(func() { _ = mount.UnmountAll(rootfs, unix.MNT_DETACH) })
	}
	src, err := vm.FindBootSource(rootfs)
	if err != nil {
		return nil, err
	}

	ph.mark("rootfs")
	if err := os.MkdirAll(vmDir, 0o711); err != nil {
		return nil, fmt.Errorf("create VM dir: %w", err)
	}
	undo.add(func() { _ = os.RemoveAll(vmDir) })
	// The owner file tells the sweep of another shim that this dir is in
	// use while no domain refers to it yet.
	if err := writeMarker(filepath.Join(vmDir, ownerFile)); err != nil {
		return nil, err
	}

	spec := vm.Spec{
		Name: name, UUID: ident.UUID(),
		VCPUs: set.vcpus, MemoryMiB: set.memMiB,
		Accel: h.accel, Emulator: h.cfg.QEMUBinary, Machine: h.cfg.Machine,
		Console: vm.Console{Socket: filepath.Join(vmDir, "console.sock"), Log: filepath.Join(vmDir, "console.log")},
		Meta: vm.Metadata{
			SandboxID: ident.SandboxID, ContainerID: r.id, Namespace: ident.Namespace,
			PodUID: ident.PodUID, PodName: ident.PodName, PodNamespace: ident.PodNamespace,
			ContainerName: ident.ContainerName, StateDir: vmDir, NUMA: placementJSON,
		},
		Pinning:     placement,
		HugePageKiB: set.pageKiB,
		MaxVCPUs:    set.maxVCPUs,
	}
	if set.maxMemMiB > set.memMiB {
		spec.MaxMemoryMiB = set.maxMemMiB
	}
	if placement != nil && len(placement.VCPUPins) > 0 && set.maxVCPUs > set.vcpus {
		// Spread over nodes: each vCPU is pinned to its guest cell.
		log.G(ctx).WithField("vm", name).Info("VM spans NUMA nodes: no vCPUs can be added live")
		spec.MaxVCPUs, set.maxVCPUs = 0, set.vcpus
	}
	if placement != nil && len(placement.Cells) > 1 && spec.MaxMemoryMiB > 0 {
		// Its memory is split over fixed guest cells, one per node.
		log.G(ctx).WithField("vm", name).Info("VM spans NUMA nodes: no memory can be added live")
		spec.MaxMemoryMiB = 0
	}
	memSize := memorySize{bootMiB: set.memMiB, maxMiB: set.memMiB + vm.HotplugMemoryMiB(&spec), blockMiB: int(vm.MemoryBlockKiB(&spec) / 1024)}
	gv, err := prepareVolumes(ctx, h, vols, diskSizes, vmDir, &undo)
	if err != nil {
		return nil, err
	}
	spec.VolumeDisks, spec.Shares, spec.VirtiofsBinary = gv.disks, gv.shares, h.cfg.Virtiofsd
	ph.mark("volumes")
	var fdServer *netfd.Server
	var guestNet *configdrive.Network
	if r.netns != "" {
		// Each step is in the record before it is taken: the cleanup
		// after a shim crash in the middle finds the TAP and the wiring.
		recordNetwork := func(n *vmNetwork) error {
			rec.Network = n
			if err := writeRecord(r.bundle, &rec); err != nil {
				return fmt.Errorf("write task record: %w", err)
			}
			return nil
		}
		pn, srv, err := setupNetwork(ctx, h, r.netns, r.podNet, name, ident.runtimeKey(), set.vcpus, recordNetwork, &undo, fdHooks...)
		if err != nil {
			return nil, err
		}
		fdServer = srv
		spec.Emulator = h.cfg.QEMUWrapper
		var dns []netip.Addr
		var search []string
		if b, err := os.ReadFile(resolvConf(r.spec)); err == nil {
			dns, search = configdrive.ParseResolvConf(b)
		} else if !errors.Is(err, fs.ErrNotExist) { // none is no DNS
			log.G(ctx).WithError(err).Warn("read the pod's resolv.conf")
		}
		if guestNet, err = driveNetwork(pn, dns, search); err != nil {
			return nil, err
		}
		if err := guestNetworkPath(ctx, pn, dns, ident, src, &set); err != nil {
			return nil, err
		}
	}
	ph.mark("network")
	// The config drive is built while the disk or kernel is prepared and
	// the domain defined; every return waits for the build first, so a
	// rollback never races it in the VM dir.
	waitDrive := func() error { return nil }
	defer func() { _ = waitDrive() }()
	if !set.drive.Disabled {
		cd, build, err := planConfigDrive(ctx, h, ident, vmDir, guestNet, gv.list, set.drive)
		if err != nil {
			return nil, err
		}
		spec.ConfigDrive = cd
		errc := make(chan error, 1)
		go func() {
			err := errors.New("config drive build did not finish")
			if perr := callSafe(ctx, "build the config drive", func() { err = build() }); perr != nil {
				err = perr
			}
			errc <- err
		}()
		waitDrive = sync.OnceValue(func() error { return <-errc })
	}
	if src.Disk != "" {
		disk, err := prepareDisk(ctx, h, rootfs, src.Disk, r.spec.Annotations[annImageName], vmDir, rec.Overlay, &undo)
		if err != nil {
			return nil, err
		}
		spec.Disk = disk
	} else {
		kernel, err := prepareKernel(rootfs, src, vmDir, set.cmdline, &undo)
		if err != nil {
			return nil, err
		}
		spec.Kernel = kernel
	}

	ph.mark("disk_or_kernel")
	domainXML, err := vm.Render(&spec)
	if err != nil {
		return nil, err
	}
	if err := h.conn.Define(domainXML); err != nil {
		return nil, err
	}
	undo.add(func() { _ = h.conn.Undefine(name) })
	ph.mark("define")
	if err := waitDrive(); err != nil {
		return nil, err
	}
	ph.mark("config_drive_wait")

	log.G(ctx).WithField("vm", name).WithField("accel", h.accel).
		WithField("vcpus", set.vcpus).WithField("memoryMiB", set.memMiB).
		WithField("took", ph.String()).Info("defined VM")
	return &vmTask{proc: newProc(r.id, r.bundle, r.stdio, publish), h: h, rec: rec, fdServer: fdServer, cgroup: cg,
		shares: len(spec.Shares), vcpus: set.vcpus, plugged: set.vcpus, memMiB: set.memMiB, maxVCPUs: max(set.maxVCPUs, set.vcpus), mem: memSize}, nil
}

// abandonIfCallerGone undoes a VM task whose Create outlived its caller:
// containerd died (or gave up) while the VM was being made, so after its
// restart it knows of no such task and nothing would ever delete it; the
// task would keep its domain, mounts, TAP and NUMA reservation, and keep
// this shim alive after the pod is gone. ttrpc cancels a call's context
// when the caller's connection closes.
func abandonIfCallerGone(ctx context.Context, t *vmTask) error {
	if ctx.Err() == nil {
		return nil
	}
	err := fmt.Errorf("create %s: the caller went away before the VM was made: %w", t.id, ctx.Err())
	if derr := t.delete(context.WithoutCancel(ctx)); derr != nil {
		return errors.Join(err, derr)
	}
	return err
}

// takeOverDomainName makes sure name is free for container id: a stopped
// domain left by an earlier container of the same identity is undefined; a
// running one is a conflict.
func takeOverDomainName(conn domains, name, id string) error {
	st, err := conn.State(name)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if st.Running {
		owner := "another container"
		if m, err := conn.Metadata(name); err == nil {
			owner = "container " + m.ContainerID
		}
		return fmt.Errorf("VM %s for container %s is still running for %s: %w", name, id, owner, errdefs.ErrAlreadyExists)
	}
	return conn.Undefine(name)
}

// prepareDisk bind-mounts the image read-only into the VM dir, checks it
// with qemu-img, and makes (or keeps) the qcow2 overlay the VM writes to.
// imageName is the container image's name where CRI gives it.
func prepareDisk(ctx context.Context, h *host, rootfs, image, imageName, vmDir, overlay string, undo *rollback) (*vm.Disk, error) {
	f, err := vm.OpenInRootfs(rootfs, image)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	base := filepath.Join(vmDir, "base"+strings.ToLower(filepath.Ext(image)))
	if err := vm.MountReadOnly(f, base); err != nil {
		return nil, err
	}
	undo.add(func() { _ = vm.Unmount(base) })
	info, err := vm.ProbeImage(ctx, h.cfg.QEMUImg, base, image)
	if err != nil {
		return nil, err
	}
	id, err := vm.IdentifyFile(f)
	if err != nil {
		return nil, err
	}
	origin := vm.OverlayOrigin{Image: imageName, Path: image, Format: info.Format, VirtualSize: info.VirtualSize, File: id}
	created, err := vm.EnsureOverlay(ctx, h.cfg.QEMUImg, base, origin, overlay)
	if err != nil {
		return nil, err
	}
	if created {
		undo.add(func() {
			for _, f := range vm.OverlayFiles(overlay) {
				_ = os.Remove(f)
			}
		})
	}
	return &vm.Disk{Path: overlay, Format: "qcow2"}, nil
}

// prepareKernel makes the kernel and initrd of the rootfs readable to QEMU
// inside the VM dir, where libvirt's labelling never touches the image's
// files.
func prepareKernel(rootfs string, src vm.BootSource, vmDir, cmdline string, undo *rollback) (*vm.Kernel, error) {
	k := &vm.Kernel{Path: filepath.Join(vmDir, kernelFile), Cmdline: cmdline}
	if err := exposeFromRootfs(rootfs, src.Kernel, k.Path, undo); err != nil {
		return nil, err
	}
	if src.Initrd != "" {
		k.Initrd = filepath.Join(vmDir, initrdFile)
		if err := exposeFromRootfs(rootfs, src.Initrd, k.Initrd, undo); err != nil {
			return nil, err
		}
	}
	return k, nil
}

// Names of the files in a VM dir that may be read-only bind mounts of
// files in the container rootfs; the base disk image is "base.<ext>".
const (
	kernelFile = "vmlinuz"
	initrdFile = "initrd"
)

// exposeFromRootfs puts the rootfs file p at dst. A file every user may
// read is bind-mounted read-only: no copy per VM, and the page cache holds
// the kernel once for all VMs of an image. Others are copied, since QEMU
// runs as its own user.
func exposeFromRootfs(rootfs, p, dst string, undo *rollback) error {
	f, err := vm.OpenInRootfs(rootfs, p)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("%s in the container image: %w", p, err)
	}
	if st.Mode().Perm()&0o004 == 0 {
		return vm.CopyFile(f, dst)
	}
	if err := vm.MountReadOnly(f, dst); err != nil {
		return err
	}
	undo.add(func() { _ = vm.Unmount(dst) })
	return nil
}

// readOnlyMounts lists the places in vmDir that may be bind mounts.
func readOnlyMounts(vmDir string) []string {
	bases, _ := filepath.Glob(filepath.Join(vmDir, "base.*"))
	shares, _ := filepath.Glob(filepath.Join(vmDir, sharesDir, "*"))
	disks, _ := filepath.Glob(filepath.Join(vmDir, volumesDir, "*"))
	return append(append(append(bases, shares...), disks...), filepath.Join(vmDir, kernelFile), filepath.Join(vmDir, initrdFile))
}

func (t *vmTask) start(ctx context.Context) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.status != task.Status_CREATED {
		return 0, fmt.Errorf("start %s: task is %s: %w", t.id, t.status, errdefs.ErrFailedPrecondition)
	}
	in, out, err := openStdio(ctx, t.stdio)
	if err != nil {
		return 0, err
	}
	ph := newPhases()
	name := t.rec.Domain
	// Start with vCPUs stopped and attach to the console first, so the
	// first line the guest prints reaches stdout.
	if err := t.h.conn.Start(name, true); err != nil {
		closeAll(in, out)
		return 0, err
	}
	ph.mark("libvirt_create")
	c, err := attachConsole(ctx, filepath.Join(t.rec.VMDir, "console.sock"), in, out)
	if err != nil {
		_ = t.h.conn.Destroy(name)
		closeAll(in, out)
		return 0, err
	}
	ph.mark("console")
	var exit *vm.ExitWatch
	pid, err := t.h.conn.PID(name)
	if err == nil {
		exit, err = t.h.conn.WatchExit(name, pid)
	}
	if err == nil {
		// Already done in the descriptor handoff for a VM with a network.
		err = joinVMCgroup(t.cgroup, pid)
	}
	if err == nil {
		err = t.chargeVirtiofsd(ctx)
	}
	if err == nil {
		err = t.h.conn.Resume(name)
	}
	ph.mark("resume")
	if err != nil {
		_ = t.h.conn.Destroy(name)
		if exit != nil {
			exit.Close()
		}
		c.close()
		return 0, err
	}
	t.console = c
	t.agent = vm.NewAgent(t.h.conn, name)
	t.exit = exit
	t.setRunningLocked(pid) // onStopped checks the status under mu: an exit seen from here on follows the TaskStart
	t.launched.Store(true)
	goSafe(ctx, "follow the VM's QEMU", func() { t.followExit(context.WithoutCancel(ctx), exit) })
	t.rec.Pid = pid
	if err := writeRecord(t.bundle, &t.rec); err != nil {
		log.G(ctx).WithError(err).WithField("vm", name).Warn("update task record")
	}
	log.G(ctx).WithField("vm", name).WithField("pid", pid).WithField("took", ph.String()).Info("started VM")
	return pid, nil
}

func closeAll(cs ...interface{ Close() error }) {
	for _, c := range cs {
		if c != nil {
			c.Close()
		}
	}
}

func (t *vmTask) kill(ctx context.Context, sig uint32) error {
	t.mu.Lock()
	if t.status == task.Status_CREATED {
		// Nothing runs yet: the task just ends, as a process would.
		t.setExitedLocked(128 + sig)
		t.mu.Unlock()
		return nil
	}
	err := t.checkRunningLocked("kill")
	paused := t.status == task.Status_PAUSED
	t.mu.Unlock()
	if err != nil {
		return err
	}
	s := unix.Signal(sig)
	switch {
	case s == unix.SIGKILL:
		err = t.h.conn.Destroy(t.rec.Domain)
	case isPowerButton(s):
		if paused && t.holdPowerButton(ctx) {
			return nil
		}
		// The fault tests kill QEMU or this shim here: a stop in flight,
		// before the guest has begun to power off.
		faultPoint("stopping")
		reconnects := t.h.conn.Reconnects()
		err = t.h.conn.Shutdown(t.rec.Domain)
		if err == nil {
			t.mu.Lock()
			t.powerPressed, t.pressReconnects = true, reconnects
			t.mu.Unlock()
		}
	default:
		return fmt.Errorf("signal %d is not supported for a VM: SIGTERM, SIGINT or SIGPWR press the ACPI power button, SIGKILL destroys it: %w", sig, errdefs.ErrInvalidArgument)
	}
	if errdefs.IsFailedPrecondition(err) || errdefs.IsNotFound(err) {
		// The domain may have stopped between our check and libvirt's.
		t.resync(ctx)
		if status, _, _, _ := t.snapshot(); status == task.Status_STOPPED {
			return fmt.Errorf("kill %s: process already finished: %w", t.id, errdefs.ErrNotFound)
		}
		if isPowerButton(s) && t.holdPowerButton(ctx) {
			return nil
		}
	}
	if err != nil && t.qemuEnded(qemuEndWait) {
		// QEMU died as the call reached its monitor, before libvirt had
		// the domain shut off ("Unable to read from monitor: Connection
		// reset by peer", the fault cell stopping/qemu): the process has
		// finished, and followExit records its exit once libvirt has.
		return fmt.Errorf("kill %s: process already finished (%v): %w", t.id, err, errdefs.ErrNotFound)
	}
	return err
}

// isPowerButton tells the signals that press the VM's ACPI power button.
func isPowerButton(s unix.Signal) bool {
	return s == unix.SIGTERM || s == unix.SIGINT || s == unix.SIGPWR
}

// holdPowerButton handles a power button for a paused VM, which libvirt
// refuses to press. Paused by Pause (before kill or racing it), the press
// waits for Resume, as a signal to a frozen container waits for the thaw.
// Paused by QEMU itself, say on a disk I/O error, there is nothing to wait
// for; the caller goes on to SIGKILL, as after an ignored SIGTERM. It
// reports whether the VM is paused.
func (t *vmTask) holdPowerButton(ctx context.Context) bool {
	t.mu.Lock()
	if t.status == task.Status_PAUSED {
		t.powerOffOnResume = true
		t.mu.Unlock()
		log.G(ctx).WithField("vm", t.rec.Domain).Info("VM is paused: its power button is pressed when it resumes")
		return true
	}
	t.mu.Unlock()
	if st, err := t.h.conn.State(t.rec.Domain); err == nil && st.Paused {
		log.G(ctx).WithField("vm", t.rec.Domain).Warn("VM was paused by QEMU (not by the shim) and cannot answer the power button")
		return true
	}
	return false
}

func (t *vmTask) pause(ctx context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.status != task.Status_RUNNING {
		return fmt.Errorf("pause %s: task is %s: %w", t.id, t.status, errdefs.ErrFailedPrecondition)
	}
	if err := t.h.conn.Suspend(t.rec.Domain); err != nil {
		return err
	}
	t.status = task.Status_PAUSED
	return nil
}

func (t *vmTask) resume(ctx context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.status != task.Status_PAUSED {
		return fmt.Errorf("resume %s: task is %s: %w", t.id, t.status, errdefs.ErrFailedPrecondition)
	}
	if err := t.h.conn.Resume(t.rec.Domain); err != nil {
		return err
	}
	t.status = task.Status_RUNNING
	if t.powerOffOnResume {
		t.powerOffOnResume = false
		reconnects := t.h.conn.Reconnects()
		if err := t.h.conn.Shutdown(t.rec.Domain); err != nil {
			log.G(ctx).WithError(err).WithField("vm", t.rec.Domain).Warn("press the power button held while paused")
		} else {
			t.powerPressed, t.pressReconnects = true, reconnects
		}
	}
	return nil
}

func (t *vmTask) stats(ctx context.Context) (vm.Stats, error) {
	t.mu.Lock()
	err := t.checkRunningLocked("stats")
	t.mu.Unlock()
	if err != nil {
		return vm.Stats{}, err
	}
	st, err := t.h.conn.Stats(t.rec.Domain)
	if errdefs.IsFailedPrecondition(err) || errdefs.IsNotFound(err) {
		// The VM stopped (or is stopping) and its exit has not been
		// recorded yet: to containerd a task whose process is gone
		// has no stats (NotFound, which its metrics collection skips
		// quietly; FailedPrecondition it logs as an error on every exit).
		return vm.Stats{}, fmt.Errorf("stats %s: the VM is not running (%v): %w", t.id, err, errdefs.ErrNotFound)
	}
	if err == nil && t.mem.maxMiB > t.mem.bootMiB {
		// libvirt counts the whole virtio-mem device as the guest's
		// memory; the guest has its boot memory and what is plugged.
		t.mu.Lock()
		st.MemoryBytes = uint64(t.mem.bootMiB+t.mem.plugFor(t.memMiB)) * mib
		t.mu.Unlock()
	}
	return st, err
}

// delete tears down everything the task made. A running VM must be killed
// first, as with any task.
func (t *vmTask) delete(ctx context.Context) error {
	t.mu.Lock()
	if t.status == task.Status_RUNNING || t.status == task.Status_PAUSED {
		t.mu.Unlock()
		return fmt.Errorf("delete %s: task is %s; kill it first: %w", t.id, t.status, errdefs.ErrFailedPrecondition)
	}
	t.setDeletedLocked()
	c, srv, exit := t.console, t.fdServer, t.exit
	t.console, t.fdServer, t.exit = nil, nil, nil
	t.mu.Unlock()
	if exit != nil {
		exit.Close()
	}
	if c != nil {
		c.close()
	}
	if srv != nil {
		_ = srv.Close()
	}
	t.abandonExecs()
	return releaseVM(ctx, t.h.conn, &t.rec, t.bundle)
}

// releaseNUMA gives the VM's host CPUs and memory back to the node.
func releaseNUMA(rec *taskRecord) error {
	if rec.NUMAOwner == "" {
		return nil
	}
	topo, err := numa.ReadTopology("/")
	if err != nil {
		return err
	}
	store, err := numa.OpenStore(rec.NUMAStore, topo, numa.Policy{})
	if err != nil {
		return err
	}
	return store.Release(rec.NUMAOwner)
}

// removeFDSocket removes the socket a VM's wrapper fetches descriptors
// from (it is named after the domain; a dead shim left it behind).
func removeFDSocket(rec *taskRecord) error {
	if rec.Network == nil {
		return nil
	}
	if err := os.Remove(netfd.SocketPath(netfd.SocketDir, rec.Domain)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// releaseVM undoes everything a VM task made, as written in its record:
// it is shared by a live Delete and by the cleanup `delete` containerd
// runs after a shim died. Every piece may already be gone. The domain is
// only touched while it still belongs to this container: a restarted
// container of the same pod reuses the name.
func releaseVM(ctx context.Context, conn domains, rec *taskRecord, bundle string) error {
	var errs []error
	if rec.Domain != "" {
		m, err := conn.Metadata(rec.Domain)
		switch {
		case errdefs.IsNotFound(err):
			errs = append(errs, removeFDSocket(rec))
		case err != nil:
			errs = append(errs, err)
		case m.ContainerID != rec.ID:
			log.G(ctx).WithField("vm", rec.Domain).WithField("owner", m.ContainerID).Info("domain now belongs to another container; leaving it")
		default:
			if st, err := conn.State(rec.Domain); err == nil && st.Running {
				if err := conn.Destroy(rec.Domain); err != nil && !errdefs.IsFailedPrecondition(err) {
					errs = append(errs, err)
				}
			}
			faultPoint("release_undefine")
			errs = append(errs, conn.Undefine(rec.Domain))
			errs = append(errs, removeFDSocket(rec))
		}
	}
	faultPoint("release_files")
	errs = append(errs, removeVMCgroup(rec))
	errs = append(errs, teardownNetwork(rec.Network))
	errs = append(errs, releaseNUMA(rec))
	if rec.VMDir != "" {
		errs = append(errs, removeVMDir(rec.VMDir))
	}
	if rec.Overlay != "" && !rec.KeepOverlay {
		for _, f := range vm.OverlayFiles(rec.Overlay) {
			if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	// The rootfs dir can go between UnmountAll's check and its unmount
	// (containerd's cleanup after its restart racing the live shim's
	// Delete, seen in TestFaultInFlight): nothing is mounted on a dir that
	// is gone.
	if err := mount.UnmountAll(filepath.Join(bundle, "rootfs"), unix.MNT_DETACH); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("unmount rootfs: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("release VM %s: %w", rec.Domain, err)
	}
	return removeRecord(bundle)
}
