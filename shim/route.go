package shim

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/containerd/containerd/mount"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kvm-shim/containerd-shim-kvm-v1/config"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// taskRoute is which backend runs a container, decided before anything is
// made for it.
type taskRoute int

const (
	routeVM           taskRoute = iota // a VM through libvirt
	routeShimSandbox                   // the pod's sandbox, with the shim as its process
	routePauseSandbox                  // the pod's sandbox as a runc pause container
	routePlain                         // a container without a VM image, with runc
)

func (r taskRoute) String() string {
	return [...]string{"vm", "sandbox", "pause sandbox", "plain"}[r]
}

// chooseRoute decides a container's backend from its spec and its rootfs
// as containerd handed it over. It mounts nothing: an image's layers are
// read where the snapshotter keeps them (vm.HasImage), so a plain
// container reaches runc unmounted, and runc mounts it once. A rootfs
// whose layers cannot be read without mounting it (a snapshotter other
// than overlayfs or native) goes the VM way, as before plain containers
// existed: the VM Create mounts it and says what it lacks.
func chooseRoute(spec *specs.Spec, bundle string, rootfs []mount.Mount, plainOn bool) (taskRoute, error) {
	if spec.Annotations[annContainerType] == "sandbox" {
		if plainOn {
			return routePauseSandbox, nil
		}
		return routeShimSandbox, nil
	}
	layers, ok := rootfsLayers(bundle, rootfs)
	if !ok {
		return routeVM, nil
	}
	isVM, err := vm.HasImage(layers)
	switch {
	case isVM:
		return routeVM, nil
	case err != nil && !plainOn:
		// As before plain containers existed: the VM Create looks into
		// the mounted rootfs and says what it lacks.
		return routeVM, nil
	case err != nil:
		return routeVM, err
	}
	if !plainOn {
		return routeVM, fmt.Errorf("no VM image in the container rootfs: expected a *.qcow2, *.img or *.raw file under %s/, "+
			"or a kernel %s/vmlinuz*; a container without one runs with runc only when plain_containers is enabled in the shim config: %w",
			vm.DiskDir, vm.BootDir, errdefs.ErrInvalidArgument)
	}
	return routePlain, nil
}

// rootfsLayers returns the directories a rootfs is made of, topmost
// first, when they can be read without a mount: the bundle's rootfs
// when containerd mounted nothing, the source of a bind mount (the
// native snapshotter, or one read-only overlay layer), or an overlay's
// upper and lower directories.
func rootfsLayers(bundle string, rootfs []mount.Mount) ([]string, bool) {
	switch {
	case len(rootfs) == 0:
		return []string{filepath.Join(bundle, "rootfs")}, true
	case len(rootfs) > 1:
		return nil, false
	}
	m := rootfs[0]
	switch m.Type {
	case "bind", "rbind":
		return []string{m.Source}, filepath.IsAbs(m.Source)
	case "overlay":
		var upper string
		var lower []string
		for _, o := range m.Options {
			if v, ok := strings.CutPrefix(o, "upperdir="); ok {
				upper = v
			} else if v, ok := strings.CutPrefix(o, "lowerdir="); ok {
				lower = strings.Split(v, ":")
			}
		}
		layers := lower
		if upper != "" {
			layers = append([]string{upper}, lower...)
		}
		for _, l := range layers {
			if !filepath.IsAbs(l) {
				return nil, false
			}
		}
		return layers, len(layers) > 0
	}
	for _, o := range m.Options {
		if o == "bind" || o == "rbind" {
			return []string{m.Source}, filepath.IsAbs(m.Source)
		}
	}
	return nil, false
}

// route decides where a container goes (chooseRoute) and, with plain
// containers on, starts the runc service before anything else of this
// shim could start a child its reaper would collect.
func (s *service) route(ctx context.Context, cfg *config.Config, spec *specs.Spec, req createRequest) (taskRoute, error) {
	if cfg.PlainContainers {
		if _, err := s.startRunc(ctx); err != nil {
			return routeVM, err
		}
	}
	rt, err := chooseRoute(spec, req.bundle, req.rootfs, cfg.PlainContainers)
	if err != nil {
		log.G(ctx).WithError(err).WithField("id", req.id).Warn("container refused: not a VM image")
	}
	return rt, err
}
