package vm

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	securejoin "github.com/cyphar/filepath-securejoin"
)

// HasImage says whether a rootfs offers something a VM could boot: a
// *.qcow2, *.img or *.raw under DiskDir or a vmlinuz* under BootDir. The
// rootfs is given as its layers (one directory, or an overlay's upper
// and lower directories), read as they are: no mount is needed, so a
// container that is not a VM can be handed to runc before anything was
// mounted for it. It only tells VM from not-VM: whether the image is a
// valid one (exactly one disk, one kernel) is FindBootSource's to say
// on the mounted rootfs. A layer's whiteout hides nothing here, so an
// image that deleted its disk in an upper layer counts as a VM image and
// is refused by FindBootSource with its reason.
func HasImage(layers []string) (bool, error) {
	for _, layer := range layers {
		for _, dir := range []string{DiskDir, BootDir} {
			found, err := layerHas(layer, dir)
			if err != nil || found {
				return found, err
			}
		}
	}
	return false, nil
}

// layerHas says whether dir inside layer holds a candidate file.
// Symlinks are resolved inside the layer, never outside it; a dir that is
// itself a link may point into another layer, which only the mounted
// rootfs can resolve: it counts as a candidate, and FindBootSource judges
// it on the mounted rootfs.
func layerHas(layer, dir string) (bool, error) {
	if fi, err := os.Lstat(filepath.Join(layer, dir)); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		return true, nil
	}
	full, err := securejoin.SecureJoin(layer, dir)
	if err != nil {
		return false, fmt.Errorf("resolve %s in the image layer %s: %w", dir, layer, err)
	}
	entries, err := os.ReadDir(full)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read %s in the image layer %s: %w", dir, layer, err)
	}
	for _, e := range entries {
		if e.Type()&fs.ModeCharDevice != 0 { // an overlay whiteout
			continue
		}
		if isCandidate(dir, e.Name()) {
			return true, nil
		}
	}
	return false, nil
}

func isCandidate(dir, name string) bool {
	if dir == BootDir {
		return strings.HasPrefix(name, "vmlinuz")
	}
	ext := strings.ToLower(filepath.Ext(name))
	for _, e := range diskExts {
		if ext == e {
			return true
		}
	}
	return false
}
