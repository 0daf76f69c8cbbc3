package shim

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kvm-shim/containerd-shim-kvm-v1/cgroup"
	"github.com/kvm-shim/containerd-shim-kvm-v1/config"
	"github.com/kvm-shim/containerd-shim-kvm-v1/configdrive"
	"github.com/kvm-shim/containerd-shim-kvm-v1/numa"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vmplan"
)

// The plan of a VM container's Create: every setting derived and every
// refusal made before anything exists. It reads the spec, the config and
// the host (the pod network, the volumes' files, libvirt's domains, the
// rootfs when it needs no mount) and changes none of them; applyCreate
// then makes the VM from it.

// createPlan is a Create decided: what the apply makes, and nothing it
// still has to check.
type createPlan struct {
	req   createRequest
	ident vmplan.Identity
	name  string // the domain's
	vmDir string // the per-container runtime dir
	// overlay is the disk overlay's path: in the pod's VM dir for a pod's
	// container (it outlives the container), else in vmDir.
	overlay  string
	set      vmSettings
	cg       *cgroup.Group // nil: QEMU stays in libvirt's cgroup
	takeOver bool          // a stopped domain of the same identity is undefined first
	vols     []plannedVolume
	net      *netPlan // nil: no pod network
	// src is the image's boot source when the rootfs was there to look at;
	// nil when it is a mount the apply makes first.
	src *vm.BootSource
	// drive is the config drive and buildDrive writes it; nil when the
	// pod turned it off.
	drive      *vm.ConfigDrive
	buildDrive func() error
}

// planCreate decides a Create. Any error is a refusal: nothing was made.
func planCreate(ctx context.Context, h *host, r createRequest, ident vmplan.Identity) (*createPlan, error) {
	p := &createPlan{req: r, ident: ident, name: ident.DomainName(), vmDir: h.layout.vmDir(ident.RuntimeKey())}
	p.overlay = filepath.Join(p.vmDir, "overlay.qcow2")
	if ident.InPod() {
		p.overlay = filepath.Join(h.layout.podVMDir(ident.PodUID, ident.ContainerName), "overlay.qcow2")
	}
	var err error
	if p.set, err = vmSettingsFrom(r.spec, h.cfg, r.stdio); err != nil {
		return nil, err
	}
	if p.cg, err = vmCgroup(ctx, h, r.spec); err != nil {
		return nil, err
	}
	if err = checkPodMemory(h, p.cg, p.set.memMiB); err != nil {
		return nil, err
	}
	driveVols, err := planCreateVolumes(ctx, h, p)
	if err != nil {
		return nil, err
	}
	if p.takeOver, err = checkDomainName(h.conn, p.name, ident.ContainerID); err != nil {
		return nil, err
	}
	if r.netns != "" {
		if p.net, err = planNetwork(ctx, r, configdrive.SanitizeHostname(ident.Name())); err != nil {
			return nil, err
		}
	}
	if len(r.rootfs) == 0 {
		// The rootfs is already there (no snapshot to mount): the image
		// is looked at now.
		if err = p.planBoot(ctx, filepath.Join(r.bundle, "rootfs")); err != nil {
			return nil, err
		}
	}
	if !p.set.drive.Disabled {
		var guest *configdrive.Network
		if p.net != nil {
			guest = p.net.guest
		}
		p.drive, p.buildDrive, err = planConfigDrive(ctx, h, driveInput{ident: ident, vmDir: p.vmDir, network: guest, volumes: driveVols,
			opts: p.set.drive})
		if err != nil {
			return nil, err
		}
	}
	return p, nil
}

// planCreateVolumes plans the container's volumes into p and returns the
// list the config drive gives the guest.
func planCreateVolumes(ctx context.Context, h *host, p *createPlan) ([]configdrive.Volume, error) {
	vols, err := classifyVolumes(ctx, p.req.spec)
	if err != nil {
		return nil, err
	}
	sizes, err := vmplan.DiskImageSizes(p.req.spec)
	if err != nil {
		return nil, err
	}
	var list []configdrive.Volume
	p.vols, list, err = planVolumes(vols, sizes, volumeReaderOf(h))
	return list, err
}

// volumeReaderOf is who a VM of h runs as, as far as the plan knows.
func volumeReaderOf(h *host) volumeReader {
	if h.ids == nil {
		return volumeReader{id: &vm.Identity{UID: uint32(h.qemuUID), GID: uint32(h.qemuGID)}}
	}
	r := h.ids.Range()
	return volumeReader{idRange: &r}
}

// planBoot finds how the image in rootfs boots (a disk image, or a kernel
// and initrd) and, with a pod network, how the guest learns it.
func (p *createPlan) planBoot(ctx context.Context, rootfs string) error {
	src, err := vm.FindBootSource(rootfs)
	if err != nil {
		return err
	}
	p.src = &src
	if p.net == nil {
		return nil
	}
	return guestNetworkPath(ctx, p.net, p.name, src, &p.set)
}

// checkDomainName makes sure name can be container id's: a running
// domain of that name is a conflict; a stopped one, left by an earlier
// container of the same identity, is taken over (undefined by the apply).
func checkDomainName(conn domains, name, id string) (takeOver bool, err error) {
	st, err := conn.State(name)
	if errdefs.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if st.Running {
		owner := "another container"
		if m, err := conn.Metadata(name); err == nil {
			owner = "container " + m.ContainerID
		}
		return false, fmt.Errorf("VM %s for container %s is still running for %s: %w", name, id, owner, errdefs.ErrAlreadyExists)
	}
	return true, nil
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
