package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// epoch is every entry's modification time: the same inputs give the same
// layers, so the same digests in every run.
var epoch = time.Unix(0, 0).UTC()

// pushAll builds the suite's images and pushes each of their tags to the
// registry at addr; it prints every tag with its digest, and returns how
// many images it pushed.
func pushAll(addr string, b bins) (int, error) {
	base, err := baseLayer(b.busybox)
	if err != nil {
		return 0, err
	}
	images := suiteImages(b)
	for _, im := range images {
		img, err := build(base, im)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", im.refs[0], err)
		}
		digest, err := img.Digest()
		if err != nil {
			return 0, err
		}
		for _, r := range im.refs {
			ref, err := name.NewTag(addr+"/"+r, name.Insecure, name.StrictValidation)
			if err != nil {
				return 0, err
			}
			if err := remote.Write(ref, img); err != nil {
				return 0, fmt.Errorf("push %s: %w", r, err)
			}
			fmt.Printf("%s %s\n", r, digest)
		}
	}
	return len(images), nil
}

// build makes one image: the base layer, a layer of its own files if it
// has any, and its command and user.
func build(base v1.Layer, im image) (v1.Image, error) {
	layers := []v1.Layer{base}
	if len(im.files) > 0 {
		var entries []*entry
		for _, f := range im.files {
			e, err := fileEntry(f)
			if err != nil {
				return nil, err
			}
			entries = append(entries, e)
		}
		l, err := layer(entries)
		if err != nil {
			return nil, err
		}
		layers = append(layers, l)
	}
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Created = v1.Time{Time: epoch}
	cf.Config = v1.Config{
		Cmd:  im.cmd,
		User: im.user,
		Env:  []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
	}
	return mutate.ConfigFile(img, cf)
}

// entry is one tar entry of a layer.
type entry struct {
	hdr  tar.Header
	body []byte
}

func dirEntry(p string, mode int64) *entry {
	return &entry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: p + "/", Mode: mode}}
}

func fileEntry(f file) (*entry, error) {
	body := []byte(f.data)
	if f.src != "" {
		b, err := os.ReadFile(f.src)
		if err != nil {
			return nil, err
		}
		body = b
	}
	return &entry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: f.path, Mode: f.mode, Size: int64(len(body))}, body: body}, nil
}

// baseLayer is the busybox base every image shares: the static busybox,
// a link for each of its applets, the account files and the usual
// directories.
func baseLayer(busybox string) (v1.Layer, error) {
	out, err := exec.Command(busybox, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list-full: %w", busybox, err)
	}
	var entries []*entry
	for _, d := range []string{"/bin", "/sbin", "/usr", "/usr/bin", "/usr/sbin", "/usr/local", "/usr/local/bin",
		"/etc", "/home", "/var", "/var/run", "/var/www", "/dev", "/proc", "/sys"} {
		entries = append(entries, dirEntry(d, 0o755))
	}
	entries = append(entries, dirEntry("/tmp", 0o1777), dirEntry("/root", 0o700))
	bb, err := fileEntry(file{path: "/bin/busybox", src: busybox, mode: 0o755})
	if err != nil {
		return nil, err
	}
	entries = append(entries, bb,
		&entry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "/etc/passwd", Mode: 0o644, Size: int64(len(passwd))}, body: []byte(passwd)},
		&entry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "/etc/group", Mode: 0o644, Size: int64(len(group))}, body: []byte(group)})
	for _, a := range strings.Fields(string(out)) {
		if a == "bin/busybox" {
			continue
		}
		entries = append(entries, &entry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "/" + a, Linkname: "/bin/busybox"}})
	}
	return layer(entries)
}

// layer packs entries, sorted by path, owned by root, into a layer.
func layer(entries []*entry) (v1.Layer, error) {
	sort.Slice(entries, func(i, j int) bool { return entries[i].hdr.Name < entries[j].hdr.Name })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.hdr
		h.Name = strings.TrimPrefix(path.Clean(h.Name), "/")
		if h.Typeflag == tar.TypeDir {
			h.Name += "/"
		}
		h.ModTime, h.Format = epoch, tar.FormatPAX
		if err := tw.WriteHeader(&h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	})
}
