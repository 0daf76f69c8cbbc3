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
	base, err := baseLayer(b)
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

// baseLayer is the busybox base every image shares: the static busybox
// with a hard link in /bin for each of its applets (as in busybox's own
// image: a masked /bin/ls must not mask the shell), pgrep and ipcs (which
// Debian's busybox lacks), the account files and the usual directories.
func baseLayer(b bins) (v1.Layer, error) {
	out, err := exec.Command(b.busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w", b.busybox, err)
	}
	var entries []*entry
	for _, d := range []string{"/bin", "/sbin", "/usr", "/usr/bin", "/usr/sbin", "/usr/local", "/usr/local/bin",
		"/etc", "/home", "/var", "/var/run", "/var/www", "/dev", "/proc", "/sys"} {
		entries = append(entries, dirEntry(d, 0o755))
	}
	entries = append(entries, dirEntry("/tmp", 0o1777), dirEntry("/root", 0o700))
	for _, f := range []file{
		{path: "/bin/busybox", src: b.busybox, mode: 0o755},
		{path: "/usr/bin/pgrep", src: b.procps, mode: 0o755},
		{path: "/etc/passwd", data: passwd, mode: 0o644},
		{path: "/etc/group", data: group, mode: 0o644},
	} {
		e, err := fileEntry(f)
		if err != nil {
			return nil, err
		}
		entries = append(entries, e)
	}
	entries = append(entries, hardLink("/usr/bin/ipcs", "/usr/bin/pgrep", 0o755))
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" && !strings.Contains(a, "/") {
			entries = append(entries, hardLink("/bin/"+a, "/bin/busybox", 0o755))
		}
	}
	return layer(entries)
}

// hardLink is a hard link at p to target, whose mode it must repeat:
// containerd applies a link entry's mode to the inode it shares, so a
// link of mode 0 would leave busybox itself unexecutable.
func hardLink(p, target string, mode int64) *entry {
	return &entry{hdr: tar.Header{Typeflag: tar.TypeLink, Name: p, Linkname: strings.TrimPrefix(target, "/"), Mode: mode}}
}

// layer packs entries, sorted by path, owned by root, into a layer.
func layer(entries []*entry) (v1.Layer, error) {
	// By path, but every hard link after the files: a link must follow
	// its target in the stream.
	sort.SliceStable(entries, func(i, j int) bool {
		li, lj := entries[i].hdr.Typeflag == tar.TypeLink, entries[j].hdr.Typeflag == tar.TypeLink
		if li != lj {
			return lj
		}
		return entries[i].hdr.Name < entries[j].hdr.Name
	})
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
