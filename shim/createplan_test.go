package shim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
	"github.com/kvm-shim/containerd-shim-kvm-v1/configdrive"
	"github.com/kvm-shim/containerd-shim-kvm-v1/numa"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vmplan"
)

// planFixture is a VM fixture for a direct-boot image whose host also
// reserves NUMA placements and host identities, so that a test sees
// whatever a Create would make.
func planFixture(t *testing.T) *vmFixture {
	f := newVMFixture(t)
	f.host.cfg.NUMAStateFile = filepath.Join(f.host.cfg.StateDir, "numa.json") // its writes show in hostState
	topo := &numa.Topology{Nodes: []numa.Node{{ID: 0, CPUs: []int{0, 1, 2, 3}, MemoryBytes: 64 << 30, Distances: []int{10}}}}
	store, err := numa.OpenStore(f.host.cfg.NUMAStateFile, topo, numa.Policy{CPUThreshold: 4, MemThreshold: 1})
	if err != nil {
		t.Fatal(err)
	}
	f.host.numa = store
	f.kernelRootfs()
	return f
}

// tree lists every file under dirs with its mode, size and time: what a
// step that made, changed or removed a file would change.
func tree(t *testing.T, dirs ...string) string {
	t.Helper()
	var b strings.Builder
	for _, d := range dirs {
		err := filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			st, err := e.Info()
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, "%s %v %d %d\n", p, st.Mode(), st.Size(), st.ModTime().UnixNano())
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}

// hostState is what a Create could make: files in the state dir and the
// bundle, mounts under them, libvirt calls and domains, NUMA
// reservations, host identities.
func (f *vmFixture) hostState(t *testing.T) string {
	t.Helper()
	ps, err := f.host.numa.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	ids, err := f.host.ids.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("files:\n%smounts: %q %q\nlibvirt calls: %q\ndomains: %d\nNUMA: %+v\nids: %v\n",
		tree(t, f.host.cfg.StateDir, f.bundle), mountsUnder(t, f.host.cfg.StateDir), mountsUnder(t, f.bundle),
		f.fake.called(), len(f.fake.doms), ps, ids)
}

// TestCreateRefusalsMakeNothing: every refusal of the plan is an error
// of its class naming the problem, and nothing at all was made: no file
// or mount in the state dir or the bundle (no task record), no libvirt
// call, no NUMA reservation, no host identity.
func TestCreateRefusalsMakeNothing(t *testing.T) {
	dirs := t.TempDir()
	mk := func(name string, files map[string]os.FileMode) string {
		d := filepath.Join(dirs, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for n, mode := range files {
			if err := os.WriteFile(filepath.Join(d, n), []byte("x"), mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(filepath.Join(d, n), mode); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	link := mk("link", nil)
	if err := os.Symlink("/etc/passwd", filepath.Join(link, vmplan.DiskImageName)); err != nil {
		t.Fatal(err)
	}
	ann := func(kv ...string) func(*vmFixture, *specs.Spec) {
		return func(_ *vmFixture, s *specs.Spec) {
			for i := 0; i < len(kv); i += 2 {
				s.Annotations[kv[i]] = kv[i+1]
			}
		}
	}
	mounts := func(m ...specs.Mount) func(*vmFixture, *specs.Spec) {
		return func(_ *vmFixture, s *specs.Spec) { s.Mounts = append(s.Mounts, m...) }
	}
	meta := map[string]string{}
	for i := 0; i < configdrive.MaxMetaEntries; i++ {
		meta[fmt.Sprintf("k%d", i)] = "v"
	}
	metaJSON, _ := json.Marshal(meta)
	var manyShares []specs.Mount
	for i := 0; i <= vm.MaxShares; i++ {
		manyShares = append(manyShares, bindMount(fmt.Sprintf("/s/%d", i), mk(fmt.Sprintf("share%d", i), nil), false))
	}
	cases := []struct {
		name  string
		setup func(*vmFixture, *specs.Spec)
		want  error
		words []string
	}{
		{"vcpus", ann(annotations.VCPUs, "lots"), errdefs.ErrInvalidArgument, []string{annotations.VCPUs}},
		{"memory", ann(annotations.Memory, "1Ki"), errdefs.ErrInvalidArgument, []string{annotations.Memory}},
		{"kernel command line", ann(annotations.KernelCmdline, "a\nb"), errdefs.ErrInvalidArgument, []string{annotations.KernelCmdline}},
		{"stdout URI", func(f *vmFixture, _ *specs.Spec) { f.stdio = stdio{Stdout: "tcp://example:1"} }, errdefs.ErrNotImplemented,
			[]string{"tcp://example:1"}},
		{"NUMA mode", ann(annotations.NUMAMode, "fast"), errdefs.ErrInvalidArgument, []string{annotations.NUMAMode}},
		{"max vCPUs", ann(annotations.MaxVCPUs, "1000"), errdefs.ErrInvalidArgument, []string{annotations.MaxVCPUs}},
		{"max memory", ann(annotations.MaxMemoryMiB, "lots"), errdefs.ErrInvalidArgument, []string{annotations.MaxMemoryMiB}},
		{"huge page size", func(_ *vmFixture, s *specs.Spec) {
			s.Linux = &specs.Linux{Resources: &specs.LinuxResources{HugepageLimits: []specs.LinuxHugepageLimit{{Pagesize: "64KB", Limit: 1 << 30}}}}
		}, errdefs.ErrInvalidArgument, []string{"hugepageLimits"}},
		{"config drive switch", ann(annotations.ConfigDrive, "maybe"), errdefs.ErrInvalidArgument, []string{annotations.ConfigDrive}},
		{"config drive metadata over the limit with the shim's entries", ann(annotations.Metadata, string(metaJSON)),
			errdefs.ErrInvalidArgument, []string{annotations.Metadata, "namespace"}},
		{"cgroups path", func(_ *vmFixture, s *specs.Spec) { s.Linux = &specs.Linux{CgroupsPath: "/a/../../etc"} },
			errdefs.ErrInvalidArgument, []string{"cgroupsPath"}},
		{"character device", func(_ *vmFixture, s *specs.Spec) {
			s.Linux = &specs.Linux{Devices: []specs.LinuxDevice{{Path: "/dev/fuse", Type: "c", Major: 10, Minor: 229}}}
		}, errdefs.ErrInvalidArgument, []string{"/dev/fuse"}},
		{"missing block device", func(_ *vmFixture, s *specs.Spec) {
			s.Linux = &specs.Linux{Devices: []specs.LinuxDevice{{Path: "/dev/xvdq", Type: "b", Major: 4095, Minor: 4095}}}
		}, errdefs.ErrFailedPrecondition, []string{"/dev/xvdq"}},
		{"malformed disk-images", ann(annotations.DiskImages, "/v=lots"), errdefs.ErrInvalidArgument, []string{annotations.DiskImages}},
		{"disk-images names no volume", func(f *vmFixture, s *specs.Spec) {
			ann(annotations.DiskImages, "/nope=1Mi")(f, s)
			mounts(bindMount("/v", mk("v", nil), false))(f, s)
		}, errdefs.ErrInvalidArgument, []string{"/nope"}},
		{"volume gone", mounts(bindMount("/etc/app", filepath.Join(dirs, "gone"), true)), errdefs.ErrFailedPrecondition,
			[]string{"/etc/app", "gone"}},
		{"volume is one file", mounts(bindMount("/etc/one", filepath.Join(mk("files", map[string]os.FileMode{"one": 0o644}), "one"), true)),
			errdefs.ErrInvalidArgument, []string{"/etc/one", "regular file"}},
		{"disk.img is a link", mounts(bindMount("/data", link, false)), errdefs.ErrInvalidArgument, []string{"/data", "symbolic link"}},
		{"read-only disk.img the VM cannot read",
			mounts(bindMount("/data", mk("private", map[string]os.FileMode{vmplan.DiskImageName: 0o600}), true)),
			errdefs.ErrFailedPrecondition, []string{"/data", "not readable"}},
		{"new disk.img on a volume with files", func(f *vmFixture, s *specs.Spec) {
			ann(annotations.DiskImages, "/full=1Mi")(f, s)
			mounts(bindMount("/full", mk("full", map[string]os.FileMode{"a": 0o644}), false))(f, s)
		}, errdefs.ErrInvalidArgument, []string{"/full", "not empty"}},
		{"new disk.img on a read-only volume", func(f *vmFixture, s *specs.Spec) {
			ann(annotations.DiskImages, "/ro=1Mi")(f, s)
			mounts(bindMount("/ro", mk("ro", nil), true))(f, s)
		}, errdefs.ErrInvalidArgument, []string{"/ro", "read-only"}},
		{"new disk.img larger than the volume", func(f *vmFixture, s *specs.Spec) {
			ann(annotations.DiskImages, "/big=1000Ti")(f, s)
			mounts(bindMount("/big", mk("big", nil), false))(f, s)
		}, errdefs.ErrInvalidArgument, []string{"/big", "free"}},
		{"a later volume refused after a new disk.img", func(f *vmFixture, s *specs.Spec) {
			ann(annotations.DiskImages, "/new=1Mi")(f, s)
			mounts(bindMount("/new", mk("new", nil), false), bindMount("/gone", filepath.Join(dirs, "gone"), false))(f, s)
		}, errdefs.ErrFailedPrecondition, []string{"/gone"}},
		{"too many shares", mounts(manyShares...), errdefs.ErrInvalidArgument, []string{fmt.Sprintf("/s/%d", vm.MaxShares)}},
		{"pod network namespace gone", func(f *vmFixture, _ *specs.Spec) { f.netns = filepath.Join(dirs, "no-netns") }, nil,
			[]string{"no-netns"}},
		{"no kernel or disk in the image", func(f *vmFixture, _ *specs.Spec) {
			if err := os.RemoveAll(filepath.Join(f.bundle, "rootfs", "boot")); err != nil {
				t.Fatal(err)
			}
		}, errdefs.ErrInvalidArgument, nil},
		{"the VM still runs for another container", func(f *vmFixture, _ *specs.Spec) {
			name := vmplan.Identity{Namespace: "default", ContainerID: "vm1"}.DomainName()
			f.fake.doms[name] = &fakeDomain{running: true, meta: vm.Metadata{ContainerID: "old"}}
		}, errdefs.ErrAlreadyExists, []string{"container old"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := planFixture(t)
			spec := &specs.Spec{Annotations: map[string]string{}}
			c.setup(f, spec)
			before := f.hostState(t)
			_, err := f.createSpec(spec)
			if err == nil || c.want != nil && !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			for _, w := range c.words {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
			if after := f.hostState(t); after != before {
				t.Errorf("the refused Create changed the host:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
	for _, d := range []string{"big", "full", "new", "ro"} {
		if _, err := os.Stat(filepath.Join(dirs, d, vmplan.DiskImageName)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a refused create left %s/%s: %v", d, vmplan.DiskImageName, err)
		}
	}
}

// TestCreateAfterRefusalsWorks: the fixture the refusals start from makes
// a VM, so each refusal above is the case's doing and its snapshot would
// see what a Create makes.
func TestCreateAfterRefusalsWorks(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: bind mounts and chown")
	}
	f := planFixture(t)
	before := f.hostState(t)
	vt, err := f.createSpec(&specs.Spec{Annotations: map[string]string{}})
	if err != nil {
		t.Fatal(err)
	}
	if after := f.hostState(t); after == before || !strings.Contains(after, "kvm-task.json") ||
		!strings.Contains(after, "define ") || strings.Contains(after, "NUMA: []") {
		t.Errorf("a Create made no record, domain or NUMA reservation:\n%s", after)
	}
	if err := vt.delete(t.Context()); err != nil {
		t.Fatal(err)
	}
}
