package vm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// mkRootfs builds a fake container rootfs from "path" -> content entries;
// content starting with "->" makes a symlink.
func mkRootfs(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		if target, ok := strings.CutPrefix(content, "->"); ok {
			err = os.Symlink(target, full)
		} else {
			err = os.WriteFile(full, []byte(content), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestFindBootSource(t *testing.T) {
	cases := []struct {
		name    string
		files   map[string]string
		want    BootSource
		wantErr []string
	}{
		{name: "one qcow2", files: map[string]string{"disk/guest.qcow2": "x", "disk/README": "y"}, want: BootSource{Disk: "/disk/guest.qcow2"}},
		{name: "img upper case", files: map[string]string{"disk/Guest.IMG": "x"}, want: BootSource{Disk: "/disk/Guest.IMG"}},
		{name: "disk wins over kernel", files: map[string]string{"disk/a.raw": "x", "boot/vmlinuz": "k"}, want: BootSource{Disk: "/disk/a.raw"}},
		{name: "kernel and initrd", files: map[string]string{"boot/vmlinuz": "k", "boot/initrd.img": "i"},
			want: BootSource{Kernel: "/boot/vmlinuz", Initrd: "/boot/initrd.img"}},
		{name: "versioned kernel alone", files: map[string]string{"boot/vmlinuz-6.1.0-cloud-amd64": "k"},
			want: BootSource{Kernel: "/boot/vmlinuz-6.1.0-cloud-amd64"}},
		{name: "nothing", files: map[string]string{"disk/README": "y"}, wantErr: []string{"/disk/", "/boot/vmlinuz"}},
		{name: "two disks", files: map[string]string{"disk/a.qcow2": "x", "disk/b.raw": "y"}, wantErr: []string{"/disk/a.qcow2", "/disk/b.raw"}},
		{name: "two kernels", files: map[string]string{"boot/vmlinuz-1": "x", "boot/vmlinuz-2": "y"},
			wantErr: []string{"vmlinuz-1", "vmlinuz-2"}},
		{name: "disk is a file", files: map[string]string{"disk": "x", "boot/vmlinuz": "k"}, want: BootSource{Kernel: "/boot/vmlinuz"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FindBootSource(mkRootfs(t, tc.files))
			if tc.wantErr != nil {
				if !errdefs.IsInvalidArgument(err) {
					t.Fatalf("want InvalidArgument, got %v", err)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not mention %q", err, w)
					}
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestOpenInRootfs(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(outside, []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	root := mkRootfs(t, map[string]string{
		"images/real.qcow2":   "image",
		"disk/abs.qcow2":      "->/images/real.qcow2",
		"disk/rel.qcow2":      "->../images/real.qcow2",
		"disk/escape.qcow2":   "->../../../../../../.." + outside,
		"disk/hostabs.qcow2":  "->" + outside,
		"disk/dotdot.qcow2":   "->../../images/real.qcow2",
		"disk/loop.qcow2":     "->loop.qcow2",
		"disk/dir.qcow2/x":    "x",
		"disk/dangling.qcow2": "->/nope",
	})
	for _, ok := range []string{"/disk/abs.qcow2", "/disk/rel.qcow2", "/images/real.qcow2"} {
		f, err := OpenInRootfs(root, ok)
		if err != nil {
			t.Errorf("%s: %v", ok, err)
			continue
		}
		b := make([]byte, 5)
		if _, err := f.Read(b); err != nil || string(b) != "image" {
			t.Errorf("%s: read %q, %v", ok, b, err)
		}
		f.Close()
	}
	bad := map[string]string{
		"/disk/escape.qcow2":   "outside the container rootfs",
		"/disk/dotdot.qcow2":   "outside the container rootfs",
		"/disk/hostabs.qcow2":  "does not exist", // absolute targets are inside the rootfs
		"/disk/loop.qcow2":     "too many levels",
		"/disk/dir.qcow2":      "not a regular file",
		"/disk/dangling.qcow2": "does not exist",
	}
	for p, want := range bad {
		f, err := OpenInRootfs(root, p)
		if err == nil {
			f.Close()
			t.Errorf("%s: opened", p)
			continue
		}
		if !strings.Contains(err.Error(), want) || !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: error %q, want InvalidArgument mentioning %q", p, err, want)
		}
	}
}
