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

	"github.com/containerd/containerd/mount"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/kvm-shim/containerd-shim-kvm-v1/config"
	"github.com/kvm-shim/containerd-shim-kvm-v1/configdrive"
	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/faultpoint"
	"github.com/kvm-shim/containerd-shim-kvm-v1/netfd"
	"github.com/kvm-shim/containerd-shim-kvm-v1/numa"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vmplan"
)

// The create path of a VM container: its settings from the OCI spec, then
// the host resources and the domain, each step undone if a later one fails.

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

func vmSettingsFrom(spec *specs.Spec, cfg config.Config, io stdio) (vmSettings, error) {
	var s vmSettings
	var err error
	if s.vcpus, s.memMiB, err = vmplan.Size(spec, cfg); err != nil {
		return s, err
	}
	if s.cmdline, err = vmplan.KernelCmdline(spec, cfg); err != nil {
		return s, err
	}
	if err = checkStdio(io); err != nil {
		return s, err
	}
	if s.numaMode, err = vmplan.NUMAMode(spec, cfg); err != nil {
		return s, err
	}
	if s.maxVCPUs, err = vmplan.HotplugMaxVCPUs(spec, cfg, s.vcpus, s.numaMode); err != nil {
		return s, err
	}
	if s.pageKiB, err = vmplan.HugePageKiB(spec); err != nil {
		return s, err
	}
	if pageMiB := int(s.pageKiB / 1024); pageMiB > 1 {
		s.memMiB = (s.memMiB + pageMiB - 1) / pageMiB * pageMiB
	}
	if s.maxMemMiB, err = vmplan.HotplugMaxMemoryMiB(spec, cfg, s.memMiB, s.numaMode); err != nil {
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
func createVMTask(ctx context.Context, h *host, r createRequest, ident vmplan.Identity, publish func(any)) (_ *vmTask, retErr error) {
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
	diskSizes, err := vmplan.DiskImageSizes(r.spec)
	if err != nil {
		return nil, err
	}
	ph.mark("checks")
	name := ident.DomainName()
	if err = takeOverDomainName(h.conn, name, ident.ContainerID); err != nil {
		return nil, err
	}

	var undo rollback
	defer func() {
		if retErr != nil {
			undo.run()
		}
	}()

	vmDir := h.layout.vmDir(ident.RuntimeKey())
	rec := taskRecord{
		Kind: kindVM, ID: r.id, Namespace: ident.Namespace,
		StateDir: h.cfg.StateDir, LibvirtSocket: h.cfg.LibvirtSocket,
		Domain: name, VMDir: vmDir, PodUID: ident.PodUID,
	}
	if ident.InPod() {
		if err = h.layout.ensurePodVMDir(ident.PodUID, ident.ContainerName); err != nil {
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
	if h.ids != nil {
		rec.IDOwner, rec.IDStore, rec.IDRange = vmOwner(name, r.id), h.cfg.VMIDStateFile, h.cfg.VMIDRange
	}
	// The record goes first: if this shim dies halfway, the cleanup
	// `delete` finds every piece from it.
	if err = writeRecord(r.bundle, &rec); err != nil {
		return nil, fmt.Errorf("write task record: %w", err)
	}
	undo.add(func() { _ = removeRecord(r.bundle) })

	var placement *vm.Pinning
	var placementJSON string
	if h.numa != nil {
		p, reserveErr := h.numa.Reserve(numa.Request{Owner: rec.NUMAOwner, VCPUs: set.vcpus, MemoryMiB: set.memMiB, Mode: set.numaMode})
		if reserveErr != nil {
			return nil, reserveErr
		}
		undo.add(func() { _ = h.numa.Release(rec.NUMAOwner) })
		b, _ := json.Marshal(p)
		placement, placementJSON = vmplan.Pinning(p), string(b)
	}

	id, own, err := h.allocateIdentity(rec.IDOwner)
	if err != nil {
		return nil, err
	}
	if own {
		undo.add(func() { _ = h.ids.Release(rec.IDOwner) })
		rec.Identity = &id
		if recErr := writeRecord(r.bundle, &rec); recErr != nil {
			return nil, fmt.Errorf("write task record: %w", recErr)
		}
	}
	if ident.InPod() {
		// The pod's VM data outlives this container; it is this VM's
		// while the VM lives (and root's again after, see releaseVM).
		if giveErr := giveToVM(filepath.Dir(rec.Overlay), id, 0o700); giveErr != nil {
			return nil, giveErr
		}
	}

	var fdHooks []netfd.ServeOption
	if cg != nil {
		if err = createVMCgroup(cg, &rec, r.bundle, &undo); err != nil {
			return nil, err
		}
		fdHooks = append(fdHooks, netfd.WithPeerHook(func(pid int) error { return joinVMCgroup(cg, pid) }))
	}

	ph.mark("record_and_numa")
	rootfs := filepath.Join(r.bundle, "rootfs")
	if len(r.rootfs) > 0 {
		if err = os.MkdirAll(rootfs, 0o711); err != nil {
			return nil, fmt.Errorf("create rootfs mount point: %w", err)
		}
		if err = mount.All(r.rootfs, rootfs); err != nil {
			return nil, fmt.Errorf("mount container rootfs: %w", err)
		}
		undo.add(func() { _ = mount.UnmountAll(rootfs, unix.MNT_DETACH) })
	}
	src, err := vm.FindBootSource(rootfs)
	if err != nil {
		return nil, err
	}

	ph.mark("rootfs")
	if mkdirErr := os.MkdirAll(vmDir, 0o700); mkdirErr != nil {
		return nil, fmt.Errorf("create VM dir: %w", mkdirErr)
	}
	undo.add(func() { _ = os.RemoveAll(vmDir) })
	if giveErr := giveToVM(vmDir, id, 0o700); giveErr != nil {
		return nil, giveErr
	}
	// The owner file tells the sweep of another shim that this dir is in
	// use while no domain refers to it yet.
	if err = writeMarker(filepath.Join(vmDir, ownerFile)); err != nil {
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
		Identity:    ownIdentity(id, own),
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
	gv, err := prepareVolumes(ctx, h, vols, diskSizes, vmDir, id, &undo)
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
			if writeRecordErr := writeRecord(r.bundle, &rec); writeRecordErr != nil {
				return fmt.Errorf("write task record: %w", writeRecordErr)
			}
			return nil
		}
		pn, srv, netErr := setupNetwork(ctx, h, r.netns, r.podNet, name, ident.RuntimeKey(), set.vcpus, id, recordNetwork, &undo, fdHooks...)
		if netErr != nil {
			return nil, netErr
		}
		fdServer = srv
		spec.Emulator = h.cfg.QEMUWrapper
		var dns []netip.Addr
		var search []string
		if b, readFileErr := os.ReadFile(resolvConf(r.spec)); readFileErr == nil {
			dns, search = configdrive.ParseResolvConf(b)
		} else if !errors.Is(readFileErr, fs.ErrNotExist) { // none is no DNS
			log.G(ctx).WithError(readFileErr).Warn("read the pod's resolv.conf")
		}
		if guestNet, netErr = driveNetwork(pn, dns, search); netErr != nil {
			return nil, netErr
		}
		if err = guestNetworkPath(ctx, pn, dns, ident, src, &set); err != nil {
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
		cd, buildDrive, planErr := planConfigDrive(ctx, h, ident, vmDir, guestNet, gv.list, set.drive)
		if planErr != nil {
			return nil, planErr
		}
		spec.ConfigDrive = cd
		errc := make(chan error, 1)
		build := func() error {
			if buildErr := buildDrive(); buildErr != nil {
				return buildErr
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
		waitDrive = sync.OnceValue(func() error { return <-errc })
	}
	if src.Disk != "" {
		disk, prepareDiskErr := prepareDisk(ctx, h, rootfs, src.Disk, r.spec.Annotations[annImageName], vmDir, rec.Overlay, &undo)
		if prepareDiskErr != nil {
			return nil, prepareDiskErr
		}
		if giveErr := giveToVM(disk.Path, id, 0o600); giveErr != nil {
			return nil, giveErr
		}
		spec.Disk = disk
	} else {
		kernel, kernelErr := prepareKernel(rootfs, src, vmDir, set.cmdline, id, &undo)
		if kernelErr != nil {
			return nil, kernelErr
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
	faultpoint.Hold(faultpoint.Defined)
	if err := waitDrive(); err != nil {
		return nil, err
	}
	ph.mark("config_drive_wait")

	log.G(ctx).WithField("vm", name).WithField("accel", h.accel).
		WithField("vcpus", set.vcpus).WithField("memoryMiB", set.memMiB).
		WithField("took", ph.String()).Info("defined VM")
	return &vmTask{proc: newProc(r.id, r.bundle, r.stdio, publish), h: h, rec: rec, fdServer: fdServer, cgroup: cg,
		shares: len(spec.Shares), vcpus: set.vcpus, plugged: set.vcpus, memMiB: set.memMiB, maxVCPUs: max(set.maxVCPUs,
			set.vcpus), mem: memSize}, nil
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
	if err = vm.MountReadOnly(f, base); err != nil {
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
func prepareKernel(rootfs string, src vm.BootSource, vmDir, cmdline string, id vm.Identity, undo *rollback) (*vm.Kernel, error) {
	k := &vm.Kernel{Path: filepath.Join(vmDir, kernelFile), Cmdline: cmdline}
	if err := exposeFromRootfs(rootfs, src.Kernel, k.Path, id, undo); err != nil {
		return nil, err
	}
	if src.Initrd != "" {
		k.Initrd = filepath.Join(vmDir, initrdFile)
		if err := exposeFromRootfs(rootfs, src.Initrd, k.Initrd, id, undo); err != nil {
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
// the kernel once for all VMs of an image. Others are copied for the VM's
// identity alone, since QEMU runs as its own user.
func exposeFromRootfs(rootfs, p, dst string, id vm.Identity, undo *rollback) error {
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
		if err := vm.CopyFile(f, dst); err != nil {
			return err
		}
		return giveToVM(dst, id, 0o600)
	}
	if err := vm.MountReadOnly(f, dst); err != nil {
		return err
	}
	undo.add(func() { _ = vm.Unmount(dst) })
	return nil
}

// ownIdentity is the identity the domain names: none when the VM runs as
// the shared QEMU user (libvirt's default label).
func ownIdentity(id vm.Identity, own bool) *vm.Identity {
	if !own {
		return nil
	}
	return &id
}
