package shim

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/containerd/mount"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kvm-shim/containerd-shim-kvm-v1/vm/vmtest"
)

func TestChooseRoute(t *testing.T) {
	layer := vmtest.Tree
	spec := func(kind string) *specs.Spec {
		return &specs.Spec{Annotations: map[string]string{annContainerType: kind}}
	}
	overlay := func(upper string, lower ...string) []mount.Mount {
		opts := []string{"index=off", "lowerdir=" + strings.Join(lower, ":")}
		if upper != "" {
			opts = append(opts, "workdir=/nonexistent/work", "upperdir="+upper)
		}
		return []mount.Mount{{Type: "overlay", Source: "overlay", Options: opts}}
	}
	vmLayer := layer(t, "disk/guest.qcow2")
	kernelLayer := layer(t, "boot/vmlinuz", "boot/initrd.img")
	plainLayer := layer(t, "bin/busybox", "boot/.keep")
	upper := layer(t)
	bind := func(src string) []mount.Mount {
		return []mount.Mount{{Type: "bind", Source: src, Options: []string{"rbind", "ro"}}}
	}
	twoMounts := append(overlay(upper, plainLayer), overlay(upper, plainLayer)...)
	device := []mount.Mount{{Type: "ext4", Source: "/dev/mapper/x"}}
	for name, tc := range map[string]struct {
		spec    *specs.Spec
		bundle  string
		rootfs  []mount.Mount
		plainOn bool
		want    taskRoute
		wantErr bool
	}{
		"sandbox, plain off":                {spec: spec("sandbox"), want: routeShimSandbox},
		"sandbox, plain on":                 {spec: spec("sandbox"), plainOn: true, want: routePauseSandbox},
		"overlay with a disk in a lower":    {spec: spec("container"), rootfs: overlay(upper, plainLayer, vmLayer), plainOn: true, want: routeVM},
		"overlay with a kernel":             {spec: spec("container"), rootfs: overlay(upper, kernelLayer), plainOn: true, want: routeVM},
		"overlay of a plain image":          {spec: spec("container"), rootfs: overlay(upper, plainLayer), plainOn: true, want: routePlain},
		"read-only overlay, no upper":       {spec: spec("container"), rootfs: overlay("", plainLayer, upper), plainOn: true, want: routePlain},
		"plain image with plain off":        {spec: spec("container"), rootfs: overlay(upper, plainLayer), want: routeVM, wantErr: true},
		"bind mount (native) of a VM":       {spec: spec("container"), rootfs: bind(vmLayer), plainOn: true, want: routeVM},
		"bind mount (native), plain":        {spec: spec("container"), rootfs: bind(plainLayer), plainOn: true, want: routePlain},
		"no rootfs mounts: the bundle's":    {spec: spec(""), bundle: filepath.Dir(plainLayer), rootfs: nil, plainOn: true, want: routePlain},
		"a block device: goes the VM way":   {spec: spec("container"), rootfs: device, plainOn: true, want: routeVM},
		"two mounts: goes the VM way":       {spec: spec("container"), rootfs: twoMounts, plainOn: true, want: routeVM},
		"relative overlay dirs: the VM way": {spec: spec("container"), rootfs: overlay("", "a", "b"), plainOn: true, want: routeVM},
	} {
		t.Run(name, func(t *testing.T) {
			bundle := tc.bundle
			if tc.rootfs == nil && bundle != "" {
				// The bundle's rootfs is the plain layer itself.
				bundle = t.TempDir()
				if err := os.Symlink(plainLayer, filepath.Join(bundle, "rootfs")); err != nil {
					t.Fatal(err)
				}
			}
			got, err := chooseRoute(tc.spec, bundle, tc.rootfs, tc.plainOn)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("chooseRoute = %v, %v; want %v (error: %v)", got, err, tc.want, tc.wantErr)
			}
			if err != nil && (!errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "/disk/") ||
				!strings.Contains(err.Error(), "enabled in the shim config") || !strings.Contains(err.Error(), "plain_containers")) {
				t.Fatalf("refusal %q: want InvalidArgument naming /disk/ and the plain_containers switch", err)
			}
		})
	}
}
