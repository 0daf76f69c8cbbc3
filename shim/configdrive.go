package shim

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
	"github.com/kvm-shim/containerd-shim-kvm-v1/configdrive"
	"github.com/kvm-shim/containerd-shim-kvm-v1/netfd"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vmplan"
)

// driveNetwork turns the pod network into the config drive's
// network_data.json: one link per pod interface, in interface order, with
// its MAC, MTU, addresses and routes (an on-link route via the
// unspecified address), and the pod's DNS.
func driveNetwork(pn netfd.PodNetwork, dns []netip.Addr, search []string) (*configdrive.Network, error) {
	n := &configdrive.Network{DNS: dns, Search: search}
	for _, ifc := range pn.Interfaces {
		routes := make([]configdrive.Route, 0, len(ifc.Routes))
		for _, r := range ifc.Routes {
			gw := r.Gateway
			if r.OnLink() {
				gw = netip.IPv4Unspecified()
				if r.Dst.Addr().Is6() {
					gw = netip.IPv6Unspecified()
				}
			}
			routes = append(routes, configdrive.Route{Dst: r.Dst, Gateway: gw})
		}
		if err := n.AddLink(ifc.MAC, ifc.MTU, ifc.Addrs, routes); err != nil {
			return nil, fmt.Errorf("pod interface %s: %w", ifc.Name, err)
		}
	}
	return n, nil
}

// driveInput is what a VM's config drive says: who the VM is, its pod
// network (nil for none), its volumes and the drive's options; it is
// written into vmDir.
type driveInput struct {
	ident   vmplan.Identity
	vmDir   string
	network *configdrive.Network
	volumes []configdrive.Volume
	opts    configdrive.Options
}

// planConfigDrive checks the drive's settings and returns where the VM's
// OpenStack config drive (label config-2) goes in its runtime dir, and the
// function that writes it; volumes are listed on it. It is rebuilt on
// every create, so it always says what the pod is now.
func planConfigDrive(ctx context.Context, h *host, in driveInput) (*vm.ConfigDrive, func() error, error) {
	ident, vmDir, opts := in.ident, in.vmDir, in.opts
	format, err := configdrive.ParseFormat(string(opts.Format))
	if err != nil {
		return nil, nil, err
	}
	if err := opts.Validate(); err != nil {
		return nil, nil, err
	}
	out := filepath.Join(vmDir, "config-2.img")
	if format == configdrive.FormatISO9660 {
		out = filepath.Join(vmDir, "config-2.iso")
	}
	name := ident.Name()
	meta := map[string]string{}
	for k, v := range opts.Meta {
		meta[k] = v
	}
	var added []string
	for k, v := range map[string]string{
		"pod_name": ident.PodName, "pod_namespace": ident.PodNamespace, "pod_uid": ident.PodUID,
		"container_name": ident.ContainerName, "namespace": ident.Namespace,
	} {
		if _, set := meta[k]; !set && v != "" {
			meta[k] = v
			added = append(added, k)
		}
	}
	if len(meta) > configdrive.MaxMetaEntries {
		slices.Sort(added)
		return nil, nil, fmt.Errorf("annotation %s: its %d entries and the %d the shim adds (%s) are more than the limit of %d: %w",
			annotations.Metadata, len(opts.Meta), len(added), strings.Join(added,
				", "), configdrive.MaxMetaEntries, errdefs.ErrInvalidArgument)
	}
	opts.Meta = meta
	inst := configdrive.Instance{
		UUID:             ident.UUID(),
		Hostname:         configdrive.SanitizeHostname(name),
		Name:             name,
		AvailabilityZone: h.cfg.AvailabilityZone,
		Volumes:          in.volumes,
	}
	build := func() error {
		start := time.Now()
		d := configdrive.Drive{Dir: vmDir, Out: out, Instance: inst, Network: in.network, Options: opts}
		if err := d.Build(ctx); err != nil {
			return err
		}
		log.G(ctx).WithField("format", format).WithField("ms", time.Since(start).Milliseconds()).Debug("built config drive")
		return nil
	}
	return &vm.ConfigDrive{Path: out, Format: string(format)}, build, nil
}
