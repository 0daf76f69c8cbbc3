package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// readTar returns the entries of a tar stream in order, with their bodies.
func readTar(t *testing.T, r io.Reader) ([]*tar.Header, map[string][]byte) {
	t.Helper()
	tr := tar.NewReader(r)
	var hdrs []*tar.Header
	bodies := map[string][]byte{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return hdrs, bodies
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		hdrs = append(hdrs, h)
		bodies[h.Name] = b
	}
}

func writeTemp(t *testing.T, dir, name, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestArchiveLayoutAndDeterminism(t *testing.T) {
	dir := t.TempDir()
	disk := writeTemp(t, dir, "disk.qcow2", "QFI\xfbnot really a disk", 0o600)
	tool := writeTemp(t, dir, "tool", "#!/bin/sh\n", 0o700)
	args := func(out string) []string {
		return []string{
			"-name", "localhost/kvm-guest/test:v1",
			"-out", out,
			"-file", "/disk/guest.qcow2=" + disk + ":0444:107:108",
			"-file", "/usr/bin/tool=" + tool,
			"-symlink", "/disk/link=../../etc/shadow",
			"-dir", "/var/empty:0700",
			"-entrypoint", "/usr/bin/tool", "-entrypoint", "--flag",
			"-env", "A=b",
		}
	}
	out1 := filepath.Join(dir, "one.tar")
	t.Setenv("SOURCE_DATE_EPOCH", "")
	if err := run(args(out1)); err != nil {
		t.Fatal(err)
	}
	// Changing the host files' mtimes must not change the output.
	later := time.Now().Add(time.Hour)
	for _, p := range []string{disk, tool} {
		if err := os.Chtimes(p, later, later); err != nil {
			t.Fatal(err)
		}
	}
	out2 := filepath.Join(dir, "two.tar")
	if err := run(args(out2)); err != nil {
		t.Fatal(err)
	}
	b1, _ := os.ReadFile(out1)
	b2, _ := os.ReadFile(out2)
	if !bytes.Equal(b1, b2) {
		t.Fatal("same inputs gave different archives")
	}

	hdrs, files := readTar(t, bytes.NewReader(b1))
	for _, h := range hdrs {
		if !h.ModTime.Equal(time.Unix(0, 0)) {
			t.Errorf("%s: mtime %v, want 0", h.Name, h.ModTime)
		}
	}
	if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout = %q", files["oci-layout"])
	}
	var idx index
	if err := json.Unmarshal(files["index.json"], &idx); err != nil {
		t.Fatal(err)
	}
	if len(idx.Manifests) != 1 {
		t.Fatalf("index has %d manifests", len(idx.Manifests))
	}
	md := idx.Manifests[0]
	if got := md.Annotations[annotationRefName]; got != "v1" {
		t.Errorf("ref.name = %q", got)
	}
	if got := md.Annotations[annotationContainerdRef]; got != "localhost/kvm-guest/test:v1" {
		t.Errorf("containerd name = %q", got)
	}
	blob := func(d descriptor) []byte {
		t.Helper()
		b, ok := files["blobs/sha256/"+strings.TrimPrefix(d.Digest, "sha256:")]
		if !ok {
			t.Fatalf("blob %s missing", d.Digest)
		}
		if sha(b) != d.Digest || int64(len(b)) != d.Size {
			t.Fatalf("blob %s: digest or size mismatch", d.Digest)
		}
		return b
	}
	var man manifest
	if err := json.Unmarshal(blob(md), &man); err != nil {
		t.Fatal(err)
	}
	var cfg imageConfig
	if err := json.Unmarshal(blob(man.Config), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.OS != "linux" || cfg.Architecture != "amd64" {
		t.Errorf("platform %s/%s", cfg.OS, cfg.Architecture)
	}
	if !reflect.DeepEqual(cfg.Config.Entrypoint, []string{"/usr/bin/tool", "--flag"}) {
		t.Errorf("entrypoint %q", cfg.Config.Entrypoint)
	}
	if !reflect.DeepEqual(cfg.Config.Env, []string{"A=b"}) {
		t.Errorf("env %q", cfg.Config.Env)
	}
	if len(man.Layers) != 1 || man.Layers[0].MediaType != mediaTypeLayer {
		t.Fatalf("layers %+v", man.Layers)
	}
	gzBlob := blob(man.Layers[0])
	zr, err := gzip.NewReader(bytes.NewReader(gzBlob))
	if err != nil {
		t.Fatal(err)
	}
	if !zr.ModTime.IsZero() || zr.Name != "" {
		t.Errorf("gzip header carries name %q / time %v", zr.Name, zr.ModTime)
	}
	layer, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if got := sha(layer); len(cfg.RootFS.DiffIDs) != 1 || cfg.RootFS.DiffIDs[0] != got {
		t.Errorf("diff_ids %q, layer is %s", cfg.RootFS.DiffIDs, got)
	}

	type ent struct {
		name       string
		typ        byte
		mode       int64
		uid, gid   int
		link, body string
		checkBody  bool
	}
	want := []ent{
		{name: "disk/", typ: tar.TypeDir, mode: 0o755},
		{name: "disk/guest.qcow2", typ: tar.TypeReg, mode: 0o444, uid: 107, gid: 108, body: "QFI\xfbnot really a disk", checkBody: true},
		{name: "disk/link", typ: tar.TypeSymlink, mode: 0o777, link: "../../etc/shadow"},
		{name: "usr/", typ: tar.TypeDir, mode: 0o755},
		{name: "usr/bin/", typ: tar.TypeDir, mode: 0o755},
		{name: "usr/bin/tool", typ: tar.TypeReg, mode: 0o755, body: "#!/bin/sh\n", checkBody: true},
		{name: "var/", typ: tar.TypeDir, mode: 0o755},
		{name: "var/empty/", typ: tar.TypeDir, mode: 0o700},
	}
	lh, lb := readTar(t, bytes.NewReader(layer))
	if len(lh) != len(want) {
		var names []string
		for _, h := range lh {
			names = append(names, h.Name)
		}
		t.Fatalf("layer entries %q, want %d entries", names, len(want))
	}
	for i, w := range want {
		h := lh[i]
		if h.Name != w.name || h.Typeflag != w.typ || h.Mode != w.mode || h.Uid != w.uid || h.Gid != w.gid || h.Linkname != w.link {
			t.Errorf("entry %d = %q type %c mode %o owner %d:%d link %q; want %+v", i, h.Name, h.Typeflag, h.Mode, h.Uid, h.Gid, h.Linkname, w)
		}
		if !h.ModTime.Equal(time.Unix(0, 0)) {
			t.Errorf("%s: mtime %v", h.Name, h.ModTime)
		}
		if w.checkBody && string(lb[h.Name]) != w.body {
			t.Errorf("%s: body %q", h.Name, lb[h.Name])
		}
	}
}

func TestSourceDateEpoch(t *testing.T) {
	dir := t.TempDir()
	src := writeTemp(t, dir, "f", "x", 0o644)
	out := filepath.Join(dir, "o.tar")
	t.Setenv("SOURCE_DATE_EPOCH", "1700000000")
	if err := run([]string{"-name", "x/y", "-out", out, "-file", "/f=" + src}); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	hdrs, files := readTar(t, f)
	for _, h := range hdrs {
		if h.ModTime.Unix() != 1700000000 {
			t.Errorf("%s: mtime %v", h.Name, h.ModTime)
		}
	}
	var idx index
	if err := json.Unmarshal(files["index.json"], &idx); err != nil {
		t.Fatal(err)
	}
	if got := idx.Manifests[0].Annotations[annotationContainerdRef]; got != "x/y:latest" {
		t.Errorf("name without tag normalized to %q", got)
	}
}

func TestBadInputs(t *testing.T) {
	dir := t.TempDir()
	src := writeTemp(t, dir, "f", "x", 0o644)
	out := filepath.Join(dir, "o.tar")
	cases := map[string][]string{
		"relative path":      {"-file", "disk/a=" + src},
		"root path":          {"-dir", "/"},
		"duplicate":          {"-file", "/a=" + src, "-symlink", "/a=b"},
		"file as parent":     {"-file", "/a=" + src, "-file", "/a/b=" + src},
		"missing source":     {"-file", "/a=" + filepath.Join(dir, "nope")},
		"directory source":   {"-file", "/a=" + dir},
		"bad mode":           {"-file", "/a=" + src + ":0999"},
		"bad symlink":        {"-symlink", "/a"},
		"digest reference":   {"-name", "x/y@sha256:00"},
		"positional garbage": {"extra"},
	}
	for name, extra := range cases {
		args := append([]string{"-name", "x/y:z", "-out", out}, extra...)
		if err := run(args); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("failed runs left %s behind", out)
	}
	left, _ := filepath.Glob(filepath.Join(dir, ".ocipack-*"))
	if len(left) != 0 {
		t.Errorf("temporary files left: %q", left)
	}
}

func TestSplitSuffix(t *testing.T) {
	cases := []struct {
		in     string
		path   string
		suffix []string
	}{
		{"a/b", "a/b", []string{}},
		{"a/b:0644", "a/b", []string{"0644"}},
		{"a/b:0644:1:2", "a/b", []string{"0644", "1", "2"}},
		{"a:1:0644", "a:1", []string{"0644"}},
		{"c:d/e", "c:d/e", []string{}},
	}
	for _, c := range cases {
		p, s := splitSuffix(c.in)
		if p != c.path || !reflect.DeepEqual(s, c.suffix) {
			t.Errorf("splitSuffix(%q) = %q, %q", c.in, p, s)
		}
	}
}
