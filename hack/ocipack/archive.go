package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/kvm-shim/containerd-shim-kvm-v1/hack/internal/pack"
	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/atomicfile"
)

// Media types and annotation keys used in the archive.
const (
	mediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	mediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	mediaTypeLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"

	annotationRefName       = "org.opencontainers.image.ref.name"
	annotationContainerdRef = "io.containerd.image.name"
)

// EntryType is the kind of a layer entry.
type EntryType int

// Layer entry kinds.
const (
	TypeFile EntryType = iota
	TypeDir
	TypeSymlink
)

// Entry is one item of the image's single layer.
type Entry struct {
	Path   string // absolute path inside the image, e.g. /disk/guest.qcow2
	Type   EntryType
	Source string // host file for TypeFile
	Target string // link target for TypeSymlink
	Mode   int64  // permission bits; -1 for a file means 0755 if the host file is executable, else 0644
	UID    int
	GID    int
}

// Spec describes the whole image.
type Spec struct {
	Name       string // full reference, e.g. localhost/kvm-guest/bios:latest
	OS, Arch   string
	Entrypoint []string
	Cmd        []string
	Env        []string
	WorkingDir string
	Labels     map[string]string
	Time       time.Time // every timestamp in the archive
	Entries    []Entry
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *platform         `json:"platform,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

type index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []descriptor `json:"manifests"`
}

type manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        descriptor   `json:"config"`
	Layers        []descriptor `json:"layers"`
}

type execConfig struct {
	Entrypoint []string          `json:"Entrypoint,omitempty"`
	Cmd        []string          `json:"Cmd,omitempty"`
	Env        []string          `json:"Env,omitempty"`
	WorkingDir string            `json:"WorkingDir,omitempty"`
	Labels     map[string]string `json:"Labels,omitempty"`
}

type rootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

type history struct {
	Created   string `json:"created"`
	CreatedBy string `json:"created_by"`
}

type imageConfig struct {
	Created      string     `json:"created"`
	Architecture string     `json:"architecture"`
	OS           string     `json:"os"`
	Config       execConfig `json:"config"`
	RootFS       rootFS     `json:"rootfs"`
	History      []history  `json:"history"`
}

// splitRef returns the normalized full name (with a tag) and the tag.
func splitRef(name string) (string, string, error) {
	if name == "" || strings.ContainsAny(name, " \t\n@") {
		return "", "", fmt.Errorf("bad image name %q (digests and blanks are not supported)", name)
	}
	slash := strings.LastIndex(name, "/")
	colon := strings.LastIndex(name, ":")
	if colon <= slash {
		return name + ":latest", "latest", nil
	}
	tag := name[colon+1:]
	if tag == "" || name[:colon] == "" {
		return "", "", fmt.Errorf("bad image name %q", name)
	}
	return name, tag, nil
}

// cleanPath turns an image path into a tar name without a leading slash.
func cleanPath(p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("path %q must be absolute", p)
	}
	c := path.Clean(p)
	if c == "/" {
		return "", fmt.Errorf("path %q names the root", p)
	}
	return strings.TrimPrefix(c, "/"), nil
}

// normalize validates the entries, fills in defaults and missing parent
// directories, and returns them sorted by path so that parents come first.
func normalize(entries []Entry) ([]Entry, error) {
	byPath := map[string]Entry{}
	for _, e := range entries {
		p, err := cleanPath(e.Path)
		if err != nil {
			return nil, err
		}
		if _, dup := byPath[p]; dup {
			return nil, fmt.Errorf("path /%s given twice", p)
		}
		e.Path = p
		if e.Type == TypeFile && e.Mode < 0 {
			st, err := os.Stat(e.Source)
			if err != nil {
				return nil, err
			}
			e.Mode = 0o644
			if st.Mode().Perm()&0o111 != 0 {
				e.Mode = 0o755
			}
		}
		byPath[p] = e
	}
	for p, e := range byPath {
		for dir := path.Dir(p); dir != "."; dir = path.Dir(dir) {
			parent, ok := byPath[dir]
			if !ok {
				byPath[dir] = Entry{Path: dir, Type: TypeDir, Mode: 0o755}
				continue
			}
			if parent.Type != TypeDir {
				return nil, fmt.Errorf("/%s is not a directory but /%s is inside it", dir, e.Path)
			}
		}
	}
	out := make([]Entry, 0, len(byPath))
	for _, e := range byPath {
		out = append(out, e)
	}
	// A parent's path is a proper prefix of its children's paths, so plain
	// lexical order always lists it first.
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// hashWriter counts and hashes what is written through it.
type hashWriter struct {
	w io.Writer
	h hash.Hash
	n int64
}

func newHashWriter(w io.Writer) *hashWriter {
	return &hashWriter{w: w, h: sha256.New()}
}

func (hw *hashWriter) Write(p []byte) (int, error) {
	n, err := hw.w.Write(p)
	hw.h.Write(p[:n])
	hw.n += int64(n)
	return n, err
}

func (hw *hashWriter) digest() string {
	return "sha256:" + hex.EncodeToString(hw.h.Sum(nil))
}

// writeLayer writes the gzip'd layer tar to w and returns the digest of the
// uncompressed tar (the diff ID).
func writeLayer(w io.Writer, entries []Entry, mtime time.Time) (string, error) {
	gz, err := gzip.NewWriterLevel(w, gzip.DefaultCompression)
	if err != nil {
		return "", err
	}
	// A zero Header means no name, no comment and MTIME 0 in the stream.
	raw := newHashWriter(gz)
	tw := tar.NewWriter(raw)
	for _, e := range entries {
		hdr := &tar.Header{
			Name:    e.Path,
			Mode:    e.Mode,
			Uid:     e.UID,
			Gid:     e.GID,
			ModTime: mtime,
		}
		switch e.Type {
		case TypeDir:
			hdr.Typeflag = tar.TypeDir
			hdr.Name += "/"
			if err := tw.WriteHeader(hdr); err != nil {
				return "", err
			}
		case TypeSymlink:
			hdr.Typeflag = tar.TypeSymlink
			hdr.Linkname = e.Target
			if err := tw.WriteHeader(hdr); err != nil {
				return "", err
			}
		case TypeFile:
			if err := writeFileEntry(tw, hdr, e.Source); err != nil {
				return "", err
			}
		default:
			return "", fmt.Errorf("/%s: unknown entry type %d", e.Path, e.Type)
		}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	if err := gz.Close(); err != nil {
		return "", err
	}
	return raw.digest(), nil
}

func writeFileEntry(tw *tar.Writer, hdr *tar.Header, src string) error {
	return pack.CopyFile(tw, src, func(size int64) error {
		hdr.Typeflag = tar.TypeReg
		hdr.Size = size
		return tw.WriteHeader(hdr)
	})
}

func marshalBlob(v any) ([]byte, string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, "", err
	}
	sum := sha256.Sum256(b)
	return b, "sha256:" + hex.EncodeToString(sum[:]), nil
}

// WriteArchive builds the image described by spec and writes it to out
// atomically (through a temporary file in the same directory).
func WriteArchive(out string, spec Spec) error {
	fullName, tag, err := splitRef(spec.Name)
	if err != nil {
		return err
	}
	entries, err := normalize(spec.Entries)
	if err != nil {
		return err
	}
	mtime := spec.Time.UTC().Truncate(time.Second)

	dir := filepath.Dir(out)
	layerFile, err := os.CreateTemp(dir, ".ocipack-layer-*")
	if err != nil {
		return err
	}
	defer func() {
		layerFile.Close()
		os.Remove(layerFile.Name())
	}()
	compressed := newHashWriter(layerFile)
	diffID, err := writeLayer(compressed, entries, mtime)
	if err != nil {
		return err
	}
	layerDesc := descriptor{MediaType: mediaTypeLayer, Digest: compressed.digest(), Size: compressed.n}
	meta, err := imageMetadata(spec, imageRef{fullName, tag}, diffID, layerDesc)
	if err != nil {
		return err
	}

	// Atomic, not synced: the build takes an output's existence for "up
	// to date", so an interrupted build must not leave half an archive;
	// after a power loss the archive is simply built again.
	return atomicfile.Write(out, atomicfile.Options{Perm: 0o644, Durability: atomicfile.NoSync}, func(w io.Writer) error {
		if _, err := layerFile.Seek(0, io.SeekStart); err != nil {
			return err
		}
		return writeLayout(w, meta, layerFile, mtime)
	})
}

// imageRef is an image's full name and its tag, as splitRef returns them.
type imageRef struct{ fullName, tag string }

// metadata is what an image archive holds beside its layer: the config,
// the manifest and the index, with their digests.
type metadata struct {
	cfgBlob, manBlob, idxBlob []byte
	cfgDigest, manDigest      string
	layer                     descriptor
}

// imageMetadata makes the config, manifest and index of an image of one
// layer, whose uncompressed digest is diffID.
func imageMetadata(spec Spec, ref imageRef, diffID string, layer descriptor) (metadata, error) {
	created := spec.Time.UTC().Truncate(time.Second).Format(time.RFC3339)
	labels := spec.Labels
	if len(labels) == 0 {
		labels = nil
	}
	cfg := imageConfig{
		Created:      created,
		Architecture: spec.Arch,
		OS:           spec.OS,
		Config: execConfig{
			Entrypoint: spec.Entrypoint,
			Cmd:        spec.Cmd,
			Env:        spec.Env,
			WorkingDir: spec.WorkingDir,
			Labels:     labels,
		},
		RootFS:  rootFS{Type: "layers", DiffIDs: []string{diffID}},
		History: []history{{Created: created, CreatedBy: "ocipack"}},
	}
	m := metadata{layer: layer}
	var err error
	if m.cfgBlob, m.cfgDigest, err = marshalBlob(cfg); err != nil {
		return m, err
	}
	man := manifest{
		SchemaVersion: 2,
		MediaType:     mediaTypeManifest,
		Config:        descriptor{MediaType: mediaTypeConfig, Digest: m.cfgDigest, Size: int64(len(m.cfgBlob))},
		Layers:        []descriptor{layer},
	}
	if m.manBlob, m.manDigest, err = marshalBlob(man); err != nil {
		return m, err
	}
	idx := index{
		SchemaVersion: 2,
		MediaType:     mediaTypeIndex,
		Manifests: []descriptor{{
			MediaType: mediaTypeManifest,
			Digest:    m.manDigest,
			Size:      int64(len(m.manBlob)),
			Annotations: map[string]string{
				annotationRefName:       ref.tag,
				annotationContainerdRef: ref.fullName,
			},
			Platform: &platform{Architecture: spec.Arch, OS: spec.OS},
		}},
	}
	m.idxBlob, err = json.Marshal(idx)
	return m, err
}

// writeLayout writes an OCI image layout as a tar to w: the layout file,
// the index, and the blobs of meta with the layer read from layer.
func writeLayout(w io.Writer, meta metadata, layer io.Reader, mtime time.Time) error {
	tw := tar.NewWriter(w)
	add := func(name string, typ byte, size int64, body io.Reader) error {
		hdr := &tar.Header{Name: name, Typeflag: typ, Size: size, Mode: 0o644, ModTime: mtime}
		if typ == tar.TypeDir {
			hdr.Mode = 0o755
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if body != nil {
			if _, err := io.CopyN(tw, body, size); err != nil {
				return err
			}
		}
		return nil
	}
	blobName := func(d string) string { return "blobs/sha256/" + strings.TrimPrefix(d, "sha256:") }
	layout := []byte(`{"imageLayoutVersion":"1.0.0"}`)
	steps := []struct {
		name string
		typ  byte
		size int64
		body io.Reader
	}{
		{"oci-layout", tar.TypeReg, int64(len(layout)), bytes.NewReader(layout)},
		{"index.json", tar.TypeReg, int64(len(meta.idxBlob)), bytes.NewReader(meta.idxBlob)},
		{"blobs/", tar.TypeDir, 0, nil},
		{"blobs/sha256/", tar.TypeDir, 0, nil},
		{blobName(meta.manDigest), tar.TypeReg, int64(len(meta.manBlob)), bytes.NewReader(meta.manBlob)},
		{blobName(meta.cfgDigest), tar.TypeReg, int64(len(meta.cfgBlob)), bytes.NewReader(meta.cfgBlob)},
		{blobName(meta.layer.Digest), tar.TypeReg, meta.layer.Size, layer},
	}
	for _, s := range steps {
		if err := add(s.name, s.typ, s.size, s.body); err != nil {
			return err
		}
	}
	return tw.Close()
}
