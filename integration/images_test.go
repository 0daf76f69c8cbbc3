//go:build integration

package integration

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// imageSpec names a guest image archive built by hack/guest/build.sh.
type imageSpec struct {
	file     string
	ref      string // the name the archive must carry; "" = whatever it carries
	optional bool
}

// image is an archive that exists, with the image name it carries.
type image struct {
	archive string
	ref     string
}

var knownImages = map[string]imageSpec{
	"kernel":   {file: "kernel.tar", ref: "localhost/kvm-guest/kernel:latest"},
	"bios":     {file: "bios.tar", ref: "localhost/kvm-guest/bios:latest"},
	"foreign":  {file: "foreign.tar", ref: "localhost/kvm-guest/foreign:latest", optional: true},
	"pause":    {file: "pause.tar", ref: sandboxImage},
	"busybox":  {file: "busybox.tar", ref: "localhost/kvm-guest/busybox:latest"},
	"nodisk":   {file: "nodisk.tar"},
	"twodisks": {file: "twodisks.tar"},
	"escape":   {file: "escape.tar"},
	"corrupt":  {file: "corrupt.tar"},
	// Built by hack/cloudimage/build.sh (make images): Debian with cloud-init.
	"cloud": {file: "cloud.tar", ref: "localhost/kvm-guest/cloud:latest", optional: true},
}

// imageNames orders knownImages for deterministic imports.
var imageNames = []string{"pause", "busybox", "kernel", "bios", "foreign", "nodisk", "twodisks", "escape", "corrupt", "cloud"}

const sandboxImage = "localhost/kvm-guest/pause:latest"

// findImages looks for every known archive in dir and reads the image name
// each carries. Missing required archives are returned, not an error.
func findImages(dir string) (found map[string]image, missing []string, err error) {
	found = map[string]image{}
	for _, name := range imageNames {
		spec := knownImages[name]
		path := filepath.Join(dir, spec.file)
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			if !spec.optional {
				missing = append(missing, spec.file)
			}
			continue
		}
		ref, err := testenv.ArchiveImageName(path)
		if err != nil {
			return nil, nil, err
		}
		if spec.ref != "" && ref != spec.ref {
			return nil, nil, fmt.Errorf("%s carries image %q, want %q", path, ref, spec.ref)
		}
		found[name] = image{archive: path, ref: ref}
	}
	return found, missing, nil
}
