package shim

import (
	"context"
	"encoding/xml"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
	"github.com/kvm-shim/containerd-shim-kvm-v1/config"
	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// criSpec is the spec CRI writes for a container with volumes.
func criSpec(volumes []specs.Mount, devices []specs.LinuxDevice) *specs.Spec {
	return testenv.CRISpec(volumes, devices)
}

// volumeFixture is a VM fixture with a direct-boot image, run as root
// (bind mounts, chown to the QEMU user).
func volumeFixture(t *testing.T) *vmFixture {
	if os.Geteuid() != 0 {
		t.Skip("needs root: bind mounts and chown")
	}
	if _, _, err := lookupQEMUUser(config.Default().QEMUUser); err != nil {
		t.Skipf("no QEMU user: %v", err)
	}
	if _, err := os.Stat(config.Default().QEMUImg); err != nil {
		t.Skip("qemu-img not installed")
	}
	f := newVMFixture(t)
	f.kernelRootfs()
	return f
}

type domainDevices struct {
	Disks []struct {
		Type   string `xml:"type,attr"`
		Driver struct {
			Type  string `xml:"type,attr"`
			Cache string `xml:"cache,attr"`
		} `xml:"driver"`
		Source struct {
			File string `xml:"file,attr"`
			Dev  string `xml:"dev,attr"`
		} `xml:"source"`
		Serial   string    `xml:"serial"`
		ReadOnly *struct{} `xml:"readonly"`
	} `xml:"devices>disk"`
	Filesystems []struct {
		Source struct {
			Dir string `xml:"dir,attr"`
		} `xml:"source"`
		Target struct {
			Dir string `xml:"dir,attr"`
		} `xml:"target"`
	} `xml:"devices>filesystem"`
	Access struct {
		Mode string `xml:"mode,attr"`
	} `xml:"memoryBacking>access"`
}

func bindMount(dst, src string, ro bool) specs.Mount {
	opt := "rw"
	if ro {
		opt = "ro"
	}
	return specs.Mount{Destination: dst, Type: "bind", Source: src, Options: []string{"rbind", "rprivate", opt}}
}

// TestCreateWithVolumes creates a VM with a read-only share, a writable
// share, an existing qcow2 disk.img and a disk.img made on request: the
// domain gets each device, and a read-only share cannot be written
// through what virtiofsd serves.
func TestCreateWithVolumes(t *testing.T) {
	f := volumeFixture(t)
	vols := t.TempDir()
	cfgMap, cache, pvc, fresh := filepath.Join(vols,
		"cm"), filepath.Join(vols, "cache"), filepath.Join(vols, "pvc"), filepath.Join(vols, "fresh")
	for _, d := range []string{cfgMap, cache, pvc, fresh} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command(f.host.cfg.QEMUImg, "create", "-q", "-f", "qcow2", filepath.Join(pvc, "disk.img"),
		"16M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	spec := criSpec([]specs.Mount{
		bindMount("/etc/app", cfgMap, true), bindMount("/cache", cache, false),
		bindMount("/data", pvc, false), bindMount("/fresh", fresh, false),
	}, nil)
	spec.Annotations = map[string]string{annotations.DiskImages: "/fresh=8Mi"}
	vt, err := f.createSpec(spec)
	if err != nil {
		t.Fatal(err)
	}
	var d domainDevices
	if err = xml.Unmarshal([]byte(f.fake.doms[vt.rec.Domain].xml), &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Disks) != 3 { // the config drive and two volumes
		t.Fatalf("disks %+v", d.Disks)
	}
	// QEMU opens each disk.img through a bind mount in the VM dir, which
	// is the volume's very file.
	for i, want := range []struct{ file, format, serial string }{
		{filepath.Join(pvc, "disk.img"), "qcow2", "data"}, {filepath.Join(fresh, "disk.img"), "raw", "fresh"},
	} {
		disk := d.Disks[i+1]
		pinned, err1 := os.Stat(disk.Source.File)
		orig, err2 := os.Stat(want.file)
		if err1 != nil || err2 != nil || !os.SameFile(pinned, orig) || !strings.HasPrefix(disk.Source.File, vt.rec.VMDir+"/") ||
			disk.Driver.Type != want.format || disk.Serial != want.serial {
			t.Errorf("disk %+v, want %s (%s, serial %s) bind-mounted under %s (%v, %v)", disk, want.file, want.format, want.serial, vt.rec.VMDir,
				err1, err2)
		}
	}
	st, err := os.Stat(filepath.Join(fresh, "disk.img"))
	if err != nil || st.Size() != 8<<20 {
		t.Fatalf("created disk.img: %v %v", st, err)
	}
	if sys := st.Sys().(*syscall.Stat_t); sys.Uid != vt.rec.Identity.UID || sys.Gid != vt.rec.Identity.GID ||
		st.Mode().Perm() != 0o600 || sys.Blocks != 0 {
		t.Errorf("created disk.img is owned by %d:%d mode %#o (want the VM's %d, 0600), %d blocks allocated (want sparse)", sys.Uid,
			sys.Gid, st.Mode().Perm(), vt.rec.Identity.UID, sys.Blocks)
	}
	if len(d.Filesystems) != 2 || d.Access.Mode != "shared" {
		t.Fatalf("filesystems %+v, memory access %q", d.Filesystems, d.Access.Mode)
	}
	roDir := d.Filesystems[0].Source.Dir
	if d.Filesystems[0].Target.Dir != "etc-app" || roDir == cfgMap || !strings.HasPrefix(roDir, vt.rec.VMDir) {
		t.Errorf("read-only share %+v: want tag etc-app served from a mount in %s", d.Filesystems[0], vt.rec.VMDir)
	}
	if err := os.WriteFile(filepath.Join(roDir, "x"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("write into the read-only share: %v, want EROFS", err)
	}
	if err := os.WriteFile(filepath.Join(cfgMap, "key"), []byte("v2"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(roDir, "key")); string(b) != "v2" {
		t.Errorf("a host change is not seen through the share: %q %v", b, err)
	}
	if fs := d.Filesystems[1]; fs.Source.Dir != cache || fs.Target.Dir != "cache" {
		t.Errorf("writable share %+v", fs)
	}

	// Delete: the mount goes, the volumes and their data stay.
	if err := vt.delete(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{roDir, d.Disks[1].Source.File} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the mount %s is still there: %v", p, err)
		}
	}
	for _, p := range []string{filepath.Join(pvc, "disk.img"), filepath.Join(fresh, "disk.img"), filepath.Join(cfgMap, "key")} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("volume data %s is gone after delete: %v", p, err)
		}
	}
}

// TestCreateVolumesRefused: every bad volume is an error of the right
// class naming it, and leaves no domain, mount or created file.
func TestCreateVolumesRefused(t *testing.T) {
	f := volumeFixture(t)
	vols := t.TempDir()
	mk := func(name string, files map[string]string) string {
		d := filepath.Join(vols, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for n, data := range files {
			if err := os.WriteFile(filepath.Join(d, n), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	backed := mk("backed", nil)
	if out, err := exec.Command(f.host.cfg.QEMUImg, "create", "-q", "-f", "qcow2", "-F", "raw", "-b", "/etc/passwd",
		filepath.Join(backed, "disk.img")).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	link := mk("link", nil)
	if err := os.Symlink("/etc/passwd", filepath.Join(link, "disk.img")); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(mk("files", map[string]string{"one": "x"}), "one")
	shares := func(n int) []specs.Mount {
		var m []specs.Mount
		for i := 0; i < n; i++ {
			m = append(m, bindMount("/s/"+strings.Repeat("x", i+1), mk("share"+string(rune('a'+i)), nil), true))
		}
		return m
	}
	cases := []struct {
		name   string
		mounts []specs.Mount
		ann    string
		want   error
		words  []string
	}{
		{"corrupt disk.img",
			[]specs.Mount{bindMount("/data", mk("corrupt", map[string]string{"disk.img": "QFI\xfb\x00\x00\x00\x03garbage"}),
				false)}, "", errdefs.ErrInvalidArgument, []string{"/data"}},
		{"disk.img with a backing file", []specs.Mount{bindMount("/data", backed, false)}, "", errdefs.ErrInvalidArgument,
			[]string{"/data", "backing file"}},
		{"disk.img is a symlink", []specs.Mount{bindMount("/data", link, false)}, "", errdefs.ErrInvalidArgument,
			[]string{"/data", "symbolic link"}},
		{"share source gone", []specs.Mount{bindMount("/etc/app", filepath.Join(vols, "gone"), true)}, "", errdefs.ErrFailedPrecondition,
			[]string{"/etc/app", "gone"}},
		{"single file", []specs.Mount{bindMount("/etc/one", file, true)}, "", errdefs.ErrInvalidArgument, []string{"/etc/one", "regular file"}},
		{"char device", []specs.Mount{bindMount("/dev/null", "/dev/null", false)}, "", errdefs.ErrInvalidArgument,
			[]string{"/dev/null", "character device"}},
		{"size larger than the volume", []specs.Mount{bindMount("/big", mk("big", nil), false)}, "/big=1000Ti", errdefs.ErrInvalidArgument,
			[]string{"/big", "free"}},
		{"size on a volume with files", []specs.Mount{bindMount("/full", mk("full", map[string]string{"a": "b"}), false)}, "/full=1Mi",
			errdefs.ErrInvalidArgument, []string{"/full", "not empty"}},
		{"size for no volume", []specs.Mount{bindMount("/v", mk("v", nil), false)}, "/nope=1Mi", errdefs.ErrInvalidArgument, []string{"/nope"}},
		{"malformed size", []specs.Mount{bindMount("/v", mk("v2", nil), false)}, "/v=lots", errdefs.ErrInvalidArgument,
			[]string{"/v", annotations.DiskImages}},
		{"a later volume fails", []specs.Mount{bindMount("/new", mk("new", nil), false), bindMount("/gone", filepath.Join(vols, "gone"), false)},
			"/new=1Mi", errdefs.ErrFailedPrecondition, []string{"/gone"}},
		{"too many shares", shares(vm.MaxShares + 1), "", errdefs.ErrInvalidArgument, []string{"/s/" + strings.Repeat("x", vm.MaxShares+1)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			spec := criSpec(c.mounts, nil)
			if c.ann != "" {
				spec.Annotations = map[string]string{annotations.DiskImages: c.ann}
			}
			before := mountsUnder(t, f.host.cfg.StateDir)
			_, err := f.createSpec(spec)
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			for _, w := range c.words {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
			if len(f.fake.doms) != 0 {
				t.Errorf("domains left: %v", f.fake.doms)
			}
			if after := mountsUnder(t, f.host.cfg.StateDir); after != before {
				t.Errorf("mounts left under the state dir: %q", after)
			}
			if _, err := os.Stat(filepath.Join(f.bundle, "kvm-task.json")); err == nil {
				t.Error("task record left")
			}
		})
	}
	for _, d := range []string{"big", "full", "new"} {
		if _, err := os.Stat(filepath.Join(vols, d, "disk.img")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a refused create left %s/disk.img: %v", d, err)
		}
	}
}

// mountsUnder lists the mount points under dir.
func mountsUnder(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && strings.HasPrefix(f[4], dir) {
			out = append(out, f[4])
		}
	}
	return strings.Join(out, " ")
}

// TestBlockVolume gives a loop device as a raw block volume through
// linux.devices: the domain gets it as a block disk under the serial of its
// container path, read-only when CRI's rule says so.
func TestBlockVolume(t *testing.T) {
	f := volumeFixture(t)
	dev, detach, err := testenv.AttachLoop(filepath.Join(t.TempDir(), "pvc"), 1<<20, "")
	if err != nil {
		t.Skip(err)
	}
	t.Cleanup(func() { _ = detach() })
	var st unix.Stat_t
	if err = unix.Stat(dev, &st); err != nil {
		t.Fatal(err)
	}
	major, minor := int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
	spec := criSpec(nil, []specs.LinuxDevice{{Path: "/dev/xvda", Type: "b", Major: major, Minor: minor}})
	spec.Linux.Resources.Devices[0].Access = "rm"
	vt, err := f.createSpec(spec)
	if err != nil {
		t.Fatal(err)
	}
	var d domainDevices
	if err := xml.Unmarshal([]byte(f.fake.doms[vt.rec.Domain].xml), &d); err != nil {
		t.Fatal(err)
	}
	disk := d.Disks[len(d.Disks)-1]
	if disk.Type != "block" || disk.Source.Dev != dev || disk.Serial != "dev-xvda" || disk.ReadOnly == nil || disk.Driver.Cache != "none" {
		t.Errorf("block volume disk %+v, want block %s serial dev-xvda read-only cache=none", disk, dev)
	}
	if err := vt.delete(context.Background()); err != nil {
		t.Fatal(err)
	}

	// A device number no block device has is refused, naming the volume.
	spec = criSpec(nil, []specs.LinuxDevice{{Path: "/dev/xvdq", Type: "b", Major: 4095, Minor: 4095}})
	if _, err := f.createSpec(spec); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "/dev/xvdq") {
		t.Errorf("missing block device: %v, want FailedPrecondition naming /dev/xvdq", err)
	}
}
