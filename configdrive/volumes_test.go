package configdrive

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
)

func testVolumes() []Volume {
	return []Volume{
		{Kind: VolumeShare, Name: "etc-app", Path: "/etc/app", ReadOnly: true},
		{Kind: VolumeShare, Name: "my_data", Path: "/my data"},
		{Kind: VolumeDisk, Name: "dev-xvda", Path: "/dev/xvda"},
	}
}

// TestRenderVolumes checks the list and the vendor-data; the image
// readers' tests (tools_test.go) read both back from vfat and iso9660
// images, as testInstance has volumes.
func TestRenderVolumes(t *testing.T) {
	inst := testInstance()
	files, err := render(inst, nil, Options{}, make([]byte, randomSeedLen))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range files {
		got[f.path] = string(f.data)
	}
	want := "share etc-app ro /etc/app\nshare my_data rw /my data\ndisk dev-xvda rw /dev/xvda\n"
	if got[VolumesFile] != want {
		t.Errorf("%s = %q, want %q", VolumesFile, got[VolumesFile], want)
	}
	var vd map[string]string
	if err = json.Unmarshal([]byte(got["openstack/latest/vendor_data.json"]), &vd); err != nil {
		t.Fatal(err)
	}
	wantCC := "#cloud-config\n" + `{"bootcmd":[["mkdir","-p","/etc/app"],["mount","-t","virtiofs","-o","ro","etc-app","/etc/app"],` +
		`["mkdir","-p","/my data"],["mount","-t","virtiofs","-o","rw","my_data","/my data"]]}` + "\n"
	if vd["cloud-init"] != wantCC {
		t.Errorf("vendor-data cloud-init = %q\nwant %q", vd["cloud-init"], wantCC)
	}

	// Without volumes: no list, and the vendor-data stays empty.
	inst.Volumes = nil
	files, err = render(inst, nil, Options{}, make([]byte, randomSeedLen))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if f.path == VolumesFile || (filepath.Base(f.path) == "vendor_data.json" && string(f.data) != "{}\n") {
			t.Errorf("no volumes, yet %s = %q", f.path, f.data)
		}
	}
}

func TestRenderVolumesRefuses(t *testing.T) {
	for name, v := range map[string]Volume{
		"relative path":   {Kind: VolumeShare, Name: "a", Path: "etc/app"},
		"line break":      {Kind: VolumeShare, Name: "a", Path: "/etc/app\nshare b rw /root"},
		"space in name":   {Kind: VolumeDisk, Name: "a b", Path: "/a"},
		"unknown kind":    {Kind: "nfs", Name: "a", Path: "/a"},
		"non-ascii name":  {Kind: VolumeShare, Name: "ä", Path: "/a"},
		"empty name":      {Kind: VolumeShare, Path: "/a"},
		"tab in the path": {Kind: VolumeShare, Name: "a", Path: "/a\tb"},
	} {
		inst := testInstance()
		inst.Volumes = []Volume{v}
		if _, err := render(inst, nil, Options{}, nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want InvalidArgument", name, err)
		}
	}
}

// TestCloudInitMountsShares feeds the vendor-data to cloud-init's own
// code: the OpenStack vendor-data conversion, then its YAML loader, and
// checks that bootcmd holds the mounts.
func TestCloudInitMountsShares(t *testing.T) {
	python := requireCloudInit(t)
	_, vd, err := renderVolumes(testVolumes())
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "vendor_data.json")
	if err = os.WriteFile(f, vd, 0o644); err != nil {
		t.Fatal(err)
	}
	const script = `
import json, sys
from cloudinit import sources, util
raw = sources.convert_vendordata(json.load(open(sys.argv[1])))
print(json.dumps(util.load_yaml(raw)))
`
	out, err := exec.Command(python, "-c", script, f).Output()
	if err != nil {
		t.Fatalf("cloud-init could not read the vendor-data: %v", err)
	}
	var cc struct {
		Bootcmd [][]string `json:"bootcmd"`
	}
	if err := json.Unmarshal(out, &cc); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(cc.Bootcmd) != 4 || cc.Bootcmd[1][len(cc.Bootcmd[1])-1] != "/etc/app" || cc.Bootcmd[3][5] != "my_data" {
		t.Errorf("bootcmd as cloud-init reads it: %q", cc.Bootcmd)
	}
}
