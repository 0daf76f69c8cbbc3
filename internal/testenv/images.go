package testenv

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
)

// ArchiveImageName returns the name `ctr images import` gives the single
// image of an archive: the io.containerd.image.name annotation of an OCI
// layout's index.json, or the one RepoTag of a docker archive's
// manifest.json.
func ArchiveImageName(archive string) (string, error) {
	f, err := os.Open(archive)
	if err != nil {
		return "", err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return "", fmt.Errorf("%s: neither index.json nor manifest.json", archive)
		}
		if err != nil {
			return "", fmt.Errorf("%s: %w", archive, err)
		}
		switch path.Clean(h.Name) {
		case "index.json":
			var idx struct {
				Manifests []struct {
					Annotations map[string]string `json:"annotations"`
				} `json:"manifests"`
			}
			if err := json.NewDecoder(tr).Decode(&idx); err != nil {
				return "", fmt.Errorf("%s: index.json: %w", archive, err)
			}
			if len(idx.Manifests) != 1 || idx.Manifests[0].Annotations["io.containerd.image.name"] == "" {
				return "", fmt.Errorf("%s: index.json must list one manifest annotated io.containerd.image.name", archive)
			}
			return idx.Manifests[0].Annotations["io.containerd.image.name"], nil
		case "manifest.json":
			var m []struct{ RepoTags []string }
			if err := json.NewDecoder(tr).Decode(&m); err != nil {
				return "", fmt.Errorf("%s: manifest.json: %w", archive, err)
			}
			if len(m) != 1 || len(m[0].RepoTags) != 1 {
				return "", fmt.Errorf("%s: manifest.json must hold one image with one tag", archive)
			}
			return m[0].RepoTags[0], nil
		}
	}
}
