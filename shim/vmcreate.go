package shim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/containerd/mount"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kvm-shim/containerd-shim-kvm-v1/netfd"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vmplan"
)

// The create path of a VM container: a plan (createplan.go), then its
// apply (createapply.go).

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
	// runc: containerd's runc task code runs the task (the pod's pause
	// with plain_containers on); the shim keeps only its records.
	runc bool
}

// createVMTask plans the Create (every refusal, before anything is made)
// and applies the plan in named steps, each undone if a later one fails,
// so a refused or failed Create leaves no mount, file or domain behind.
func createVMTask(ctx context.Context, h *host, r createRequest, ident vmplan.Identity, publish func(any)) (*vmTask, error) {
	ph := r.took
	if ph == nil {
		ph = newPhases()
	}
	p, err := planCreate(ctx, h, r, ident)
	if err != nil {
		return nil, err
	}
	ph.mark("plan")
	return applyCreate(ctx, h, p, ph, publish)
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

// prepareDisk bind-mounts the image read-only into the VM dir, checks it
// with qemu-img, and makes (or keeps) the qcow2 overlay the VM writes to.
// The overlay records the container image's name where CRI gives it.
func (c *createRun) prepareDisk(ctx context.Context) (*vm.Disk, error) {
	h, image, vmDir, overlay, undo := c.h, c.src.Disk, c.p.vmDir, c.rec.Overlay, &c.undo
	imageName := c.p.req.spec.Annotations[annImageName]
	f, err := vm.OpenInRootfs(c.rootfs, image)
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
func (c *createRun) prepareKernel() (*vm.Kernel, error) {
	k := &vm.Kernel{Path: filepath.Join(c.p.vmDir, kernelFile), Cmdline: c.p.set.cmdline}
	if err := c.exposeFromRootfs(c.src.Kernel, k.Path); err != nil {
		return nil, err
	}
	if c.src.Initrd != "" {
		k.Initrd = filepath.Join(c.p.vmDir, initrdFile)
		if err := c.exposeFromRootfs(c.src.Initrd, k.Initrd); err != nil {
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
func (c *createRun) exposeFromRootfs(p, dst string) error {
	f, err := vm.OpenInRootfs(c.rootfs, p)
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
		return giveToVM(dst, c.id, 0o600)
	}
	if err := vm.MountReadOnly(f, dst); err != nil {
		return err
	}
	c.undo.add(func() { _ = vm.Unmount(dst) })
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
