package configdrive

// Tests against the real readers of the image: fsck.fat, mtools, isoinfo,
// blkid, and Debian's cloud-init on the host. Each skips with the reason
// when its tool is missing (apt-get install dosfstools mtools genisoimage
// cloud-init).

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func requireTools(t testing.TB, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := lookTool(tool); err != nil {
			t.Skipf("%v (Debian: apt-get install dosfstools mtools genisoimage cloud-init)", err)
		}
	}
}

// buildTest builds the typical test drive in format f and returns its path.
func buildTest(t *testing.T, f Format) string {
	t.Helper()
	dir := t.TempDir()
	opts := testOptions(t)
	opts.Format = f
	out := filepath.Join(dir, "config-drive.img")
	d := Drive{Dir: dir, Out: out, Instance: testInstance(), Network: testNetwork(t), Options: opts}
	if err := d.Build(context.Background()); err != nil {
		t.Fatalf("Build(%s): %v", f, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("Build left %d entries in its directories, want only the image: %v", len(entries), entries)
	}
	return out
}

// command runs a host tool (argument vector, no shell) and returns stdout.
func command(t *testing.T, env []string, name string, args ...string) []byte {
	t.Helper()
	path, err := lookTool(name)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, stderr.Bytes())
	}
	return out
}

var mtoolsEnv = []string{"MTOOLS_SKIP_CHECK=1", "MTOOLSRC=/dev/null"}

// checkContent compares a file read back from the image with what render
// produced; meta_data.json differs only in its random_seed.
func checkContent(t *testing.T, path string, got []byte, want file) {
	t.Helper()
	if !strings.HasSuffix(path, "meta_data.json") {
		if !bytes.Equal(got, want.data) {
			t.Errorf("%s read back as %q, want %q", path, got, want.data)
		}
		return
	}
	var m map[string]any
	if err := json.Unmarshal(got, &m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	seed, _ := m["random_seed"].(string)
	raw, err := base64.StdEncoding.DecodeString(seed)
	if err != nil || len(raw) != randomSeedLen {
		t.Errorf("%s: random_seed is %d bytes (%v), want %d", path, len(raw), err, randomSeedLen)
	}
	wantMD, err := renderMetaData(testInstance(), testOptions(t), raw)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, wantMD) {
		t.Errorf("%s read back as\n%s\nwant\n%s", path, got, wantMD)
	}
}

func TestVFATReaders(t *testing.T) {
	requireTools(t, "mkfs.vfat", "mcopy", "fsck.fat", "mdir", "mtype")
	img := buildTest(t, FormatVFAT)

	st, err := os.Stat(img)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() != VFATSize {
		t.Errorf("image is %d bytes, want %d", st.Size(), VFATSize)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("image mode %v, want 0600: it holds user-data", st.Mode().Perm())
	}

	// fsck.fat -n: read-only check; exit 0 and no complaint.
	out := command(t, nil, "fsck.fat", "-n", img)
	t.Logf("fsck.fat -n: %s", bytes.TrimSpace(out))
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], " files, ") {
		t.Errorf("fsck.fat -n reported more than the summary:\n%s", out)
	}

	// mdir sees the label and every directory and file.
	out = command(t, mtoolsEnv, "mdir", "-i", img, "-/", "-a", "::")
	t.Logf("mdir -/:\n%s", out)
	if !strings.Contains(string(out), "Volume in drive : is config-2") {
		t.Errorf("mdir does not show the label config-2:\n%s", out)
	}

	// mtype reads every file back with the content render gave.
	files, err := render(testInstance(), testNetwork(t), testOptions(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		got := command(t, mtoolsEnv, "mtype", "-i", img, "::/"+f.path)
		checkContent(t, f.path, got, f)
	}

	// blkid (what cloud-init's find_devs_with uses) finds type and label.
	if _, err := lookTool("blkid"); err == nil {
		out = command(t, nil, "blkid", "-p", "-o", "export", img)
		if !strings.Contains(string(out), "LABEL=config-2\n") || !strings.Contains(string(out), "TYPE=vfat\n") {
			t.Errorf("blkid -p does not see a vfat labelled config-2:\n%s", out)
		}
	}
}

func TestISO9660Readers(t *testing.T) {
	requireTools(t, "isoinfo")
	if _, _, err := isoTool(); err != nil {
		t.Skipf("%v (Debian: apt-get install genisoimage)", err)
	}
	img := buildTest(t, FormatISO9660)

	out := command(t, nil, "isoinfo", "-d", "-i", img)
	if !strings.Contains(string(out), "Volume id: config-2\n") {
		t.Errorf("isoinfo -d does not show volume id config-2:\n%s", out)
	}
	if !strings.Contains(string(out), "Rock Ridge signatures version") || !strings.Contains(string(out), "Joliet with UCS level") {
		t.Errorf("isoinfo -d shows no Rock Ridge or no Joliet:\n%s", out)
	}
	out = command(t, nil, "isoinfo", "-R", "-f", "-i", img)
	t.Logf("isoinfo -R -f:\n%s", out)
	files, err := render(testInstance(), testNetwork(t), testOptions(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !strings.Contains(string(out), "/"+f.path+"\n") {
			t.Errorf("isoinfo -R -f does not list /%s", f.path)
		}
		// Rock Ridge and Joliet names both give the content back.
		checkContent(t, f.path, command(t, nil, "isoinfo", "-R", "-i", img, "-x", "/"+f.path), f)
		checkContent(t, f.path, command(t, nil, "isoinfo", "-J", "-i", img, "-x", "/"+f.path), f)
	}
	if _, err := lookTool("blkid"); err == nil {
		out = command(t, nil, "blkid", "-p", "-o", "export", img)
		if !strings.Contains(string(out), "LABEL=config-2\n") || !strings.Contains(string(out), "TYPE=iso9660\n") {
			t.Errorf("blkid -p does not see an iso9660 labelled config-2:\n%s", out)
		}
	}
}

func TestBuildReplacesAtomically(t *testing.T) {
	requireTools(t, "mkfs.vfat", "mcopy")
	dir := t.TempDir()
	out := filepath.Join(dir, "drive.img")
	if err := os.WriteFile(out, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	inst := testInstance()
	// A failing build leaves the old image and no temporary file behind.
	if err := (Drive{Dir: dir, Out: out}).Build(context.Background()); err == nil {
		t.Fatal("Build without uuid succeeded")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := (Drive{Dir: dir, Out: out, Instance: inst}).Build(ctx); err == nil {
		t.Fatal("Build with a cancelled context succeeded")
	}
	if b, _ := os.ReadFile(out); string(b) != "old" {
		t.Errorf("failed builds changed the image")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("failed builds left files behind: %v", entries)
	}
	// Build, the parts one by one, builds the same Drive.
	if err := (Drive{Dir: dir, Out: out, Instance: inst}).Build(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(out); st.Size() != VFATSize {
		t.Errorf("image not replaced: %d bytes", st.Size())
	}
}
