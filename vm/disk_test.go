package vm

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

func needQemuImg(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("qemu-img")
	if err != nil {
		t.Skip("qemu-img not installed")
	}
	return p
}

func qemuImg(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("qemu-img", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("qemu-img %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// qemuIO runs one qemu-io command on the qcow2 image at p.
func qemuIO(t *testing.T, command, p string) {
	t.Helper()
	out, err := exec.Command("qemu-io", "-f", "qcow2", "-c", command, p).CombinedOutput()
	if err != nil || strings.Contains(string(out), "Pattern verification failed") {
		t.Fatalf("qemu-io %q %s: %v\n%s", command, p, err, out)
	}
}

func backingOf(t *testing.T, overlay string) string {
	t.Helper()
	var info ImageInfo
	if err := json.Unmarshal([]byte(qemuImg(t, "info", "--output=json", "-U", overlay)), &info); err != nil {
		t.Fatal(err)
	}
	return info.BackingFile
}

// Images that name host files are refused from their header: qemu-img is
// never run on them (here it cannot be: its path does not exist).
func TestProbeImageRefusesHostReferences(t *testing.T) {
	needQemuImg(t)
	dir := t.TempDir()
	hostFile := filepath.Join(dir, "host-file")
	if err := os.WriteFile(hostFile, []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	dataFile := filepath.Join(dir, "data.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", "-o", "data_file="+hostFile+",data_file_raw=on", dataFile, "1M")
	backed := filepath.Join(dir, "backed.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", "-F", "raw", "-b", hostFile, backed)
	notQcow2 := filepath.Join(dir, "plain.qcow2")
	if err := os.WriteFile(notQcow2, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, name, want string }{
		{dataFile, "/disk/a.qcow2", "external file"},
		{dataFile, "/disk/a.img", "external file"},
		{backed, "/disk/b.qcow2", "backing file"},
		{backed, "/disk/b.img", "backing file"},
		{notQcow2, "/disk/c.qcow2", "not a qcow2 image"},
	} {
		_, err := ProbeImage(context.Background(), "/nonexistent/qemu-img", tc.path, tc.name)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.name) {
			t.Errorf("%s as %s: %v, want InvalidArgument naming the image and %q", filepath.Base(tc.path), tc.name, err, tc.want)
		}
	}
}

func TestProbeImageFormats(t *testing.T) {
	tool := needQemuImg(t)
	dir := t.TempDir()
	q := filepath.Join(dir, "q")
	qemuImg(t, "create", "-q", "-f", "qcow2", q, "2M")
	r := filepath.Join(dir, "r")
	qemuImg(t, "create", "-q", "-f", "raw", r, "3M")
	for _, tc := range []struct {
		path, name, format string
		size               int64
	}{
		{q, "/disk/x.qcow2", "qcow2", 2 << 20},
		{q, "/disk/x.img", "qcow2", 2 << 20},
		{r, "/disk/x.img", "raw", 3 << 20},
		{r, "/disk/x.raw", "raw", 3 << 20},
		{q, "/disk/x.raw", "raw", 0}, // a qcow2 file named .raw is a raw disk of its bytes
	} {
		info, err := ProbeImage(context.Background(), tool, tc.path, tc.name)
		if err != nil {
			t.Errorf("%s as %s: %v", filepath.Base(tc.path), tc.name, err)
			continue
		}
		if info.Format != tc.format || (tc.size != 0 && info.VirtualSize != tc.size) {
			t.Errorf("%s as %s: %+v, want %s of %d bytes", filepath.Base(tc.path), tc.name, info, tc.format, tc.size)
		}
	}
}

// A restarted container mounts its image at a new path: the kept overlay
// is re-pointed there, and only when the image is the file it was made on.
func TestEnsureOverlayKeepsDiskAcrossBasePaths(t *testing.T) {
	tool := needQemuImg(t)
	dir := t.TempDir()
	ctx := context.Background()
	image := filepath.Join(dir, "image.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", image, "4M")
	// mountAt stands in for the read-only bind mount of the image file
	// into a container's runtime dir: a symlink, the same file and, unlike
	// a hard link, the same ctime. copy is an image whose layer was
	// unpacked anew.
	mountAt := func(name string, copied bool) (string, OverlayOrigin) {
		p := filepath.Join(dir, name, "base.qcow2")
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if copied {
			qemuImg(t, "convert", "-O", "qcow2", image, p)
		} else if err := os.Symlink(image, p); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		id, err := IdentifyFile(f)
		if err != nil {
			t.Fatal(err)
		}
		return p, OverlayOrigin{Image: "example/vm:1", Path: "/disk/vm.qcow2", Format: "qcow2", VirtualSize: 4 << 20, File: id}
	}
	overlay := filepath.Join(dir, "pod", "overlay.qcow2")
	if err := os.MkdirAll(filepath.Dir(overlay), 0o755); err != nil {
		t.Fatal(err)
	}

	first, origin := mountAt("vm-1", false)
	created, err := EnsureOverlay(ctx, tool, first, origin, overlay)
	if err != nil || !created {
		t.Fatalf("first container: created %v, %v", created, err)
	}
	qemuIO(t, "write -P 0x5a 1M 64k", overlay)
	st1, err := os.Stat(overlay)
	if err != nil {
		t.Fatal(err)
	}
	if err = os.RemoveAll(filepath.Dir(first)); err != nil { // the first container's runtime dir is gone
		t.Fatal(err)
	}

	second, again := mountAt("vm-2", false)
	again.Image = "example/vm:latest" // another name of the same image
	created, err = EnsureOverlay(ctx, tool, second, again, overlay)
	if err != nil || created {
		t.Fatalf("restarted container: created %v, %v", created, err)
	}
	if st2, err := os.Stat(overlay); err != nil || !os.SameFile(st1, st2) {
		t.Fatalf("the overlay was not kept: %v", err)
	}
	if got := backingOf(t, overlay); got != second {
		t.Errorf("overlay backed by %q, want %q", got, second)
	}
	// The guest's writes are still there, read through the new base.
	qemuIO(t, "read -P 0x5a 1M 64k", overlay)

	_, unpacked := mountAt("vm-3", true)
	grown := again
	grown.VirtualSize = 8 << 20
	// Same inode, size and mtime, but the file's ctime moved on (here by
	// a chmod; in life, a layer unpacked anew into a reused inode).
	time.Sleep(10 * time.Millisecond)
	if err := os.Chmod(image, 0o640); err != nil {
		t.Fatal(err)
	}
	_, touched := mountAt("vm-4", false)
	for i, other := range []OverlayOrigin{unpacked, grown, touched} {
		_, err := EnsureOverlay(ctx, tool, filepath.Join(dir, fmt.Sprint("other-", i)), other, overlay)
		if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "recreate the pod") {
			t.Errorf("container now on %s: %v, want FailedPrecondition", other, err)
		}
		if got := backingOf(t, overlay); got != second {
			t.Errorf("a refused overlay was re-pointed to %q", got)
		}
	}
}

// An overlay without a record of its origin (made before origins were
// recorded) cannot be told safe to re-point: refused, and left alone.
func TestEnsureOverlayRefusesOverlayWithoutOrigin(t *testing.T) {
	tool := needQemuImg(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "base.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", base, "1M")
	overlay := filepath.Join(dir, "overlay.qcow2")
	gone := filepath.Join(dir, "gone.qcow2")
	qemuImg(t, "create", "-q", "-u", "-f", "qcow2", "-F", "qcow2", "-b", gone, overlay, "1M")
	origin := OverlayOrigin{Path: "/disk/vm.qcow2", Format: "qcow2", VirtualSize: 1 << 20}
	created, err := EnsureOverlay(context.Background(), tool, base, origin, overlay)
	if created || !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "no record") {
		t.Errorf("created %v, %v; want FailedPrecondition", created, err)
	}
	if got := backingOf(t, overlay); got != gone {
		t.Errorf("overlay re-pointed to %q", got)
	}
}
