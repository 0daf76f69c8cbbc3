package vmplan

import (
	"errors"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// criSpec is the spec CRI writes for a container with volumes.
func criSpec(volumes []specs.Mount, devices []specs.LinuxDevice) *specs.Spec {
	return testenv.CRISpec(volumes, devices)
}

func TestClassifyVolumes(t *testing.T) {
	spec := criSpec([]specs.Mount{
		{Destination: "/etc/app", Type: "bind", Source: "/k/configmap/app", Options: []string{"rbind", "rprivate", "ro"}},
		{Destination: "/cache", Source: "/k/empty-dir/cache", Options: []string{"rbind", "rprivate", "rw"}},
		{Destination: "/dev/xvda", Type: "bind", Source: "/k/plugins/dev/uid", Options: []string{"rbind"}},
		// A terminationMessagePath other than /dev/termination-log.
		{Destination: "/tmp/done", Type: "bind", Source: "/var/lib/kubelet/pods/uid-1/containers/vm/4f2a1b3c", Options: []string{"rbind", "rw"}},
	}, []specs.LinuxDevice{{Path: "/dev/xvda", Type: "b", Major: 7, Minor: 3}})
	// CRI writes a read-only device's rule with access "r".
	spec.Linux.Devices = append(spec.Linux.Devices, specs.LinuxDevice{Path: "/dev/xvdb", Type: "b", Major: 7, Minor: 4})
	four, seven := int64(4), int64(7)
	spec.Linux.Resources.Devices = append(spec.Linux.Resources.Devices,
		specs.LinuxDeviceCgroup{Allow: true, Type: "b", Major: &seven, Minor: &four, Access: "rm"})

	got, skipped, err := ClassifyVolumes(spec)
	if err != nil {
		t.Fatal(err)
	}
	// Kernel file systems (6), CRI's plumbing (5) and the termination message.
	if len(skipped) != 12 || !strings.Contains(strings.Join(skipped, ","), "/etc/resolv.conf (the guest's DNS") {
		t.Errorf("skipped %q", skipped)
	}
	want := []Volume{
		{Kind: VolDevice, Dest: "/dev/xvda", Major: 7, Minor: 3},
		{Kind: VolDevice, Dest: "/dev/xvdb", Major: 7, Minor: 4, ReadOnly: true},
		{Kind: VolBind, Dest: "/etc/app", Source: "/k/configmap/app", ReadOnly: true},
		{Kind: VolBind, Dest: "/cache", Source: "/k/empty-dir/cache"},
	}
	if len(got) != len(want) {
		t.Fatalf("volumes %+v\nwant %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("volume %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestClassifyVolumesRefuses(t *testing.T) {
	for name, spec := range map[string]*specs.Spec{
		"character device": criSpec(nil, []specs.LinuxDevice{{Path: "/dev/fuse", Type: "c", Major: 10, Minor: 229}}),
		"line break in a path": criSpec([]specs.Mount{
			{Destination: "/a\nshare x rw /etc", Type: "bind", Source: "/k/a", Options: []string{"rbind"}},
		}, nil),
	} {
		_, _, err := ClassifyVolumes(spec)
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want InvalidArgument", name, err)
		}
	}
	_, _, err := ClassifyVolumes(criSpec(nil, []specs.LinuxDevice{{Path: "/dev/fuse", Type: "c", Major: 10, Minor: 229}}))
	if err == nil || !strings.Contains(err.Error(), "/dev/fuse") {
		t.Errorf("the error does not name the device: %v", err)
	}
}

func TestDiskImageSizes(t *testing.T) {
	spec := &specs.Spec{Annotations: map[string]string{annotations.DiskImages: "/data=1Gi, /scratch/=512Mi"}}
	got, err := DiskImageSizes(spec)
	if err != nil || got["/data"] != 1<<30 || got["/scratch"] != 512<<20 || len(got) != 2 {
		t.Errorf("sizes %v, %v", got, err)
	}
	for _, bad := range []string{"", "/data", "data=1Gi", "/data=", "/data=-1", "/data=1Xi", "/data=99999999999Ti"} {
		spec.Annotations[annotations.DiskImages] = bad
		if _, err := DiskImageSizes(spec); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), annotations.DiskImages) {
			t.Errorf("%q: err = %v, want InvalidArgument naming the annotation", bad, err)
		}
	}
}

func TestGuestNames(t *testing.T) {
	vols := []Volume{
		{Dest: "/etc/app"}, {Dest: "/dev/xvda"}, {Dest: "/"}, {Dest: "/my data/ä"},
		{Dest: "/a-b"}, {Dest: "/a/b"},
		{Dest: "/var/lib/very/long/path/name"},
	}
	got := GuestNames(vols, 20)
	want := []string{"etc-app", "dev-xvda", "root", "my_data-_", "a-b-", "a-b-", "var-lib-ver-"}
	for i, w := range want {
		if !strings.HasPrefix(got[i], w) || len(got[i]) > 20 {
			t.Errorf("name of %s = %q, want %q...", vols[i].Dest, got[i], w)
		}
	}
	if got[4] == got[5] {
		t.Errorf("/a-b and /a/b share the name %q", got[4])
	}
	if again := GuestNames(vols, 20); strings.Join(again, " ") != strings.Join(got, " ") {
		t.Errorf("names are not stable: %q then %q", got, again)
	}
}
