package vm

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kvm-shim/containerd-shim-kvm-v1/vm/vmtest"
)

func TestHasImage(t *testing.T) {
	mk := vmtest.Tree
	outside := mk(t, "disk/host.qcow2")
	for name, tc := range map[string]struct {
		layers [][]string
		want   bool
	}{
		"busybox":             {[][]string{{"bin/sh", "etc/passwd", "boot/.keep"}}, false},
		"empty":               {[][]string{{}}, false},
		"disk":                {[][]string{{"disk/guest.qcow2"}}, true},
		"disk upper case ext": {[][]string{{"disk/GUEST.RAW"}}, true},
		"other file in disk":  {[][]string{{"disk/README"}}, false},
		"kernel":              {[][]string{{"boot/vmlinuz-6.1", "boot/initrd.img"}}, true},
		"disk in lower layer": {[][]string{{"bin/sh"}, {"disk/a.img"}}, true},
		"no layer":            {nil, false},
	} {
		t.Run(name, func(t *testing.T) {
			var layers []string
			for _, files := range tc.layers {
				layers = append(layers, mk(t, files...))
			}
			got, err := HasImage(layers)
			if err != nil || got != tc.want {
				t.Fatalf("HasImage = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
	// A disk dir that is a link may point into another layer, which only
	// the mounted rootfs resolves: it is left to FindBootSource (the VM
	// way), whatever it points at, and nothing is read through it.
	t.Run("disk dir is a link", func(t *testing.T) {
		layer := t.TempDir()
		if err := os.Symlink(filepath.Join(outside, "disk"), filepath.Join(layer, "disk")); err != nil {
			t.Fatal(err)
		}
		if got, err := HasImage([]string{layer}); err != nil || !got {
			t.Fatalf("HasImage = %v, %v; want true: a linked disk dir is the VM Create's to judge", got, err)
		}
	})
	// A file link inside a real disk dir still resolves inside the layer:
	// a link out of it does not make the image a VM image by its target.
	t.Run("kernel link out of the layer", func(t *testing.T) {
		layer := mk(t, "boot/.keep")
		if err := os.Symlink(filepath.Join(outside, "disk"), filepath.Join(layer, "boot", "README")); err != nil {
			t.Fatal(err)
		}
		if got, err := HasImage([]string{layer}); err != nil || got {
			t.Fatalf("HasImage = %v, %v; want false", got, err)
		}
	})
}
