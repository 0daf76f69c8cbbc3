package configdrive

// Debian's cloud-init, run on the host against the drive's files: its
// ConfigDrive data source reads them, and its network_data.json converter
// turns network_data.json into netplan, networkd and ENI configuration.
// Nothing here touches the host's configuration: the data source runs with
// its paths in a temporary directory and reads a seed directory, and
// net-convert writes below --directory.

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// requireCloudInit skips unless cloud-init is installed, and returns the
// Python that runs it (the one named by /usr/bin/cloud-init's #! line: a
// python3 first in PATH, e.g. pyenv's, may not see Debian's modules).
func requireCloudInit(t *testing.T) (python string) {
	t.Helper()
	requireTools(t, "cloud-init", "mkfs.vfat", "mcopy")
	ci, _ := lookTool("cloud-init")
	python = "/usr/bin/python3"
	if b, err := os.ReadFile(ci); err == nil && strings.HasPrefix(string(b), "#!") {
		if f := strings.Fields(strings.SplitN(string(b[2:]), "\n", 2)[0]); len(f) > 0 {
			python = f[0]
		}
	}
	if out, err := exec.Command(python, "-c", "import cloudinit.sources.DataSourceConfigDrive").CombinedOutput(); err != nil {
		t.Skipf("%s cannot import cloudinit (%v: %s): apt-get install cloud-init", python, err, out)
	}
	return python
}

// extractVFAT builds the typical drive as vfat and copies its files out
// with mcopy (no mount): the directory is what a guest would mount.
func extractVFAT(t *testing.T) string {
	t.Helper()
	img := buildTest(t, FormatVFAT)
	dir := filepath.Join(t.TempDir(), "config_drive")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	command(t, mtoolsEnv, "mcopy", "-s", "-n", "-i", img, "::/openstack", dir+"/")
	return dir
}

// readConfigDrive runs cloud-init's DataSourceConfigDrive over a seed
// directory holding the drive's files, the way cloud-init-local does over
// the mounted drive, and prints what it understood as JSON.
const readConfigDrive = `
import json, os, sys
from cloudinit import distros, helpers, sources
from cloudinit.sources import DataSourceConfigDrive as cd

drive, tmp, mac = sys.argv[1], sys.argv[2], sys.argv[3]
paths = helpers.Paths({"cloud_dir": os.path.join(tmp, "cloud"), "run_dir": os.path.join(tmp, "run")})
os.makedirs(os.path.join(tmp, "cloud", "seed"))
os.symlink(drive, paths.seed_dir + "/config_drive")
sys_cfg = {"datasource_list": ["ConfigDrive"]}
distro = distros.fetch("debian")("debian", {}, paths)
ds = cd.DataSourceConfigDrive(sys_cfg, distro, paths)
if not ds.get_data():
    sys.exit("ConfigDrive found no data")
ds.known_macs = {mac: "eth0"}
direct = cd.read_config_drive(drive)
host = ds.get_hostname()
print(json.dumps({
    "source": ds.source,
    "version": ds.version,
    "dsmode": ds.dsmode,
    "instance_id": ds.get_instance_id(),
    "hostname": getattr(host, "hostname", host),
    "availability_zone": ds.availability_zone,
    "public_ssh_keys": ds.get_public_ssh_keys(),
    "userdata_raw": ds.get_userdata_raw().decode(),
    "meta": ds.metadata.get("meta"),
    "random_seed_len": len(ds.metadata.get("random_seed", b"")),
    "network_config": ds.network_config,
    "direct_version": direct["version"],
    "direct_vendordata": direct.get("vendordata"),
}, sort_keys=True, default=str))
`

func TestCloudInitReadsConfigDrive(t *testing.T) {
	python := requireCloudInit(t)
	drive := extractVFAT(t)
	cmd := exec.Command(python, "-c", readConfigDrive, drive, t.TempDir(), testMAC)
	cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("cloud-init's ConfigDrive reader failed: %v\n%s%s", err, out, stderr)
	}
	t.Logf("cloud-init read: %s", out)
	var got struct {
		Source           string            `json:"source"`
		Version          int               `json:"version"`
		InstanceID       string            `json:"instance_id"`
		Hostname         string            `json:"hostname"`
		AvailabilityZone string            `json:"availability_zone"`
		PublicSSHKeys    []string          `json:"public_ssh_keys"`
		UserdataRaw      string            `json:"userdata_raw"`
		Meta             map[string]string `json:"meta"`
		RandomSeedLen    int               `json:"random_seed_len"`
		NetworkConfig    struct {
			Config []map[string]any `json:"config"`
		} `json:"network_config"`
		DirectVersion    int `json:"direct_version"`
		DirectVendordata any `json:"direct_vendordata"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	inst := testInstance()
	if got.Version != 2 || got.DirectVersion != 2 {
		t.Errorf("config drive version %d/%d, want 2", got.Version, got.DirectVersion)
	}
	if got.InstanceID != inst.UUID {
		t.Errorf("instance id %q, want %q", got.InstanceID, inst.UUID)
	}
	if got.Hostname != "web-0" {
		t.Errorf("hostname %q, want web-0", got.Hostname)
	}
	if got.AvailabilityZone != "zone-a" {
		t.Errorf("availability zone %q, want zone-a", got.AvailabilityZone)
	}
	keys := strings.Join(got.PublicSSHKeys, "\n")
	if len(got.PublicSSHKeys) != 2 || !strings.Contains(keys, testKeyEd25519) || !strings.Contains(keys, testKeyRSA) {
		t.Errorf("public keys %q, want the ed25519 and the RSA test keys", got.PublicSSHKeys)
	}
	if got.UserdataRaw != testUserData {
		t.Errorf("user-data %q, want %q", got.UserdataRaw, testUserData)
	}
	if got.Meta["role"] != "web" || got.Meta["team"] != "blue" {
		t.Errorf("meta %v", got.Meta)
	}
	if got.RandomSeedLen != randomSeedLen {
		t.Errorf("random seed %d bytes, want %d", got.RandomSeedLen, randomSeedLen)
	}
	if got.DirectVendordata == nil {
		t.Error("vendor_data.json was not read")
	}
	// The data source's own network conversion: a physical eth0 with both
	// static subnets, and the DNS servers.
	cfg, _ := json.Marshal(got.NetworkConfig.Config)
	for _, want := range []string{`"mac_address":"52:54:00:12:34:56"`, `"name":"eth0"`, `"type":"physical"`, `"mtu":1450`,
		`"address":"10.244.1.23"`, `"netmask":"255.255.255.0"`, `"gateway":"10.244.1.1"`,
		`"address":"fd00:10:244:1::17"`, `"gateway":"fd00:10:244:1::1"`,
		`"type":"nameserver"`, `"address":"10.96.0.10"`, `"address":"fd00:10:96::a"`} {
		if !strings.Contains(string(cfg), want) {
			t.Errorf("cloud-init network config lacks %s:\n%s", want, cfg)
		}
	}
}

// netConvert runs `cloud-init devel net-convert` on the drive's
// network_data.json and returns the files it wrote, by relative path. The
// guest's NICs are eth0 (testMAC) and, when given, more "name,mac" pairs.
func netConvert(t *testing.T, networkData, outputKind string, nics ...string) map[string]string {
	t.Helper()
	dir := t.TempDir()
	args := []string{"devel", "net-convert",
		"--network-data", networkData, "--kind", "network_data.json",
		"--output-kind", outputKind, "--distro", "debian", "--directory", dir}
	for _, nic := range append([]string{"eth0," + testMAC}, nics...) {
		args = append(args, "--mac", nic)
	}
	cmd := exec.Command("cloud-init", args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cloud-init devel net-convert --output-kind %s: %v\n%s", outputKind, err, out)
	}
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		files[rel] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func TestCloudInitNetConvert(t *testing.T) {
	requireCloudInit(t)
	nd := filepath.Join(extractVFAT(t), "openstack", "latest", "network_data.json")

	t.Run("netplan", func(t *testing.T) {
		files := netConvert(t, nd, "netplan")
		y := files["etc/netplan/50-cloud-init.yaml"]
		t.Logf("netplan:\n%s", y)
		// The YAML is asserted as text: one value per line, in the shape
		// cloud-init 22.4 writes.
		for _, want := range []string{
			"eth0:", "macaddress: '52:54:00:12:34:56'", "mtu: 1450",
			"- 10.244.1.23/24", "- fd00:10:244:1::17/64",
			"to: 0.0.0.0/0", "via: 10.244.1.1",
			"to: ::/0", "via: fd00:10:244:1::1",
			"to: 192.168.50.0/24", "via: 10.244.1.254",
			"- 10.96.0.10", "- fd00:10:96::a",
			"- default.svc.cluster.local", "- svc.cluster.local", "- cluster.local",
		} {
			if !containsLine(y, want) {
				t.Errorf("netplan config has no line %q", want)
			}
		}
	})
	t.Run("networkd", func(t *testing.T) {
		files := netConvert(t, nd, "networkd")
		n := files["etc/systemd/network/10-cloud-init-eth0.network"]
		t.Logf("networkd:\n%s", n)
		for _, want := range []string{
			"MACAddress=52:54:00:12:34:56", "MTUBytes=1450",
			"Address=10.244.1.23/24", "Address=fd00:10:244:1::17/64",
			"Destination=0.0.0.0/0", "Gateway=10.244.1.1",
			"Destination=::/0", "Gateway=fd00:10:244:1::1",
			"Destination=192.168.50.0/24", "Gateway=10.244.1.254",
			"DNS=10.96.0.10 fd00:10:96::a",
			"Domains=default.svc.cluster.local svc.cluster.local cluster.local",
		} {
			if !containsLine(n, want) {
				t.Errorf("networkd config has no line %q", want)
			}
		}
	})
	t.Run("eni", func(t *testing.T) {
		files := netConvert(t, nd, "eni")
		e := files["etc/network/interfaces.d/50-cloud-init"]
		t.Logf("eni:\n%s", e)
		for _, want := range []string{
			"iface eth0 inet static", "address 10.244.1.23/24", "mtu 1450",
			"post-up route add default gw 10.244.1.1 || true",
			"post-up route add -net 192.168.50.0/24 gw 10.244.1.254 || true",
			"iface eth0 inet6 static", "address fd00:10:244:1::17/64",
			"post-up route add -A inet6 default gw fd00:10:244:1::1 || true",
			"dns-nameservers 10.96.0.10 fd00:10:96::a",
			"dns-search default.svc.cluster.local svc.cluster.local cluster.local",
		} {
			if !containsLine(e, want) {
				t.Errorf("eni config has no line %q", want)
			}
		}
	})
}

func containsLine(text, line string) bool {
	for _, l := range strings.Split(text, "\n") {
		l = strings.TrimSpace(l)
		if l == line || strings.TrimSpace(strings.TrimPrefix(l, "-")) == line {
			return true
		}
	}
	return false
}
