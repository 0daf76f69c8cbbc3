//go:build integration

package integration

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
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
	"nodisk":   {file: "nodisk.tar"},
	"twodisks": {file: "twodisks.tar"},
	"escape":   {file: "escape.tar"},
	"corrupt":  {file: "corrupt.tar"},
	// Built by hack/cloudimage/build.sh (make images): Debian with cloud-init.
	"cloud": {file: "cloud.tar", ref: "localhost/kvm-guest/cloud:latest", optional: true},
}

// imageNames orders knownImages for deterministic imports.
var imageNames = []string{"pause", "kernel", "bios", "foreign", "nodisk", "twodisks", "escape", "corrupt", "cloud"}

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
		ref, err := archiveImageName(path)
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

// archiveImageName reads the image name that `ctr images import` will give
// the single image in an OCI archive (index.json annotation
// io.containerd.image.name) or a docker archive (manifest.json RepoTags).
func archiveImageName(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return "", fmt.Errorf("%s: no index.json or manifest.json", path)
		}
		if err != nil {
			return "", fmt.Errorf("%s: %w", path, err)
		}
		switch filepath.Clean(h.Name) {
		case "index.json":
			var idx struct {
				Manifests []struct {
					Annotations map[string]string `json:"annotations"`
				} `json:"manifests"`
			}
			if err := json.NewDecoder(tr).Decode(&idx); err != nil {
				return "", fmt.Errorf("%s: index.json: %w", path, err)
			}
			if len(idx.Manifests) != 1 || idx.Manifests[0].Annotations["io.containerd.image.name"] == "" {
				return "", fmt.Errorf("%s: index.json must list one manifest annotated io.containerd.image.name", path)
			}
			return idx.Manifests[0].Annotations["io.containerd.image.name"], nil
		case "manifest.json":
			var m []struct{ RepoTags []string }
			if err := json.NewDecoder(tr).Decode(&m); err != nil {
				return "", fmt.Errorf("%s: manifest.json: %w", path, err)
			}
			if len(m) != 1 || len(m[0].RepoTags) != 1 {
				return "", fmt.Errorf("%s: manifest.json must hold one image with one tag", path)
			}
			return m[0].RepoTags[0], nil
		}
	}
}
