//go:build integration

package integration

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// Config drive annotations (docs/annotations.md, configdrive/annotations.go).
const (
	annUserData    = "kvm.containerd.io/user-data"
	annSSHKeys     = "kvm.containerd.io/ssh-authorized-keys"
	annMetadata    = "kvm.containerd.io/metadata"
	annDriveFormat = "kvm.containerd.io/config-drive-format"
	annDrive       = "kvm.containerd.io/config-drive"
)

// testSSHKey returns a fresh OpenSSH public key line with a comment.
func testSSHKey(t *testing.T) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	k, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k))) + " it@kvm-shim"
}

// configDrive finds the domain's config drive: the disk whose file is
// named config-2.*; "" when it has none.
func (d *domain) configDrive() (file, device, bus string) {
	for _, disk := range d.Devices.Disks {
		if strings.HasPrefix(filepath.Base(disk.Source.File), "config-2.") {
			return disk.Source.File, disk.Device, disk.Target.Bus
		}
	}
	return "", "", ""
}

// driveMetaData is the part of meta_data.json the tests check.
type driveMetaData struct {
	UUID       string            `json:"uuid"`
	Hostname   string            `json:"hostname"`
	PublicKeys map[string]string `json:"public_keys"`
	Meta       map[string]string `json:"meta"`
}

// readVFAT reads a file from a FAT image with mtools (no loop mount).
func readVFAT(image, path string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("mtype", "-i", image, "::"+path)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("mtype -i %s ::%s: %v: %s", image, path, err, stderr.String())
	}
	return stdout.Bytes(), nil
}

// TestCRIConfigDrive boots the bios image (a disk: no ip= on any kernel
// command line) in a pod with user-data, an SSH key and metadata. The guest
// reads the config drive: hostname (the pod name, sanitised), uuid, one
// key, the user-data's size; and configures the pod's IP and gateway from
// its network_data.json, so the host reaches the guest. The drive's files
// are checked from the host as well.
func TestCRIConfigDrive(t *testing.T) {
	s := requireKVM(t, "bios", "pause")
	key := testSSHKey(t)
	userData := "#cloud-config\n# TestCRIConfigDrive\nruncmd:\n  - [echo, hello from user-data]\n"
	const podName, hostname = "cfg-drive.web-0", "cfg-drive-web-0"
	s.forEachFlavour(t, func(t *testing.T, c *containerd) {
		c.cleanupAfter(t)
		cl := c.cri(t)
		meta := map[string]string{"role": "integration", "flavour": c.Flavour.Name}
		metaJSON, _ := json.Marshal(meta)
		v := c.startNetVM(t, cl, podName, "bios", map[string]string{
			annUserData: userData,
			annSSHKeys:  key,
			annMetadata: string(metaJSON),
		})
		d, err := dumpDomain(v.domain)
		if err != nil {
			t.Fatal(err)
		}
		if d.OS.Cmdline != "" {
			t.Errorf("the bios image boots from its disk, yet the domain has a kernel command line %q", d.OS.Cmdline)
		}

		line, err := waitLogMessage(v.logPath, guestDriveLine, bootTimeout)
		if err != nil {
			t.Fatalf("the guest did not report its config drive: %v", err)
		}
		want := fmt.Sprintf("KVM-GUEST-CONFIGDRIVE hostname=%s uuid=%s keys=1 userdata=%d", hostname, d.UUID, len(userData))
		if line != want {
			t.Errorf("guest read its config drive as\n  %q\nwant\n  %q%s", line, want, keysHint(line))
		}
		c.checkGuestNetwork(t, v)
		if err := waitEcho(v.addr(7), netTimeout); err != nil {
			t.Errorf("pod %s from the host: %v", podName, err)
		}

		file, device, bus := d.configDrive()
		if file == "" || device != "disk" || bus != "virtio" || filepath.Ext(file) != ".img" {
			t.Errorf("config drive %q device %q bus %q, want a vfat config-2.img on a virtio disk\n%s", file, device, bus, d.raw)
		} else {
			checkDriveFiles(t, file, d.UUID, hostname, key, userData, meta, v.net.ip)
		}

		c.stopAndCheckNetwork(t, cl, v)
		cl.removePod(t, v.podContainer)
		assertNothingLeft(t, c, v.shimIDs()...)
	})
}

// keysHint explains a guest that counts two keys where the pod gave one.
func keysHint(line string) string {
	if !strings.Contains(line, " keys=2 ") {
		return ""
	}
	return "\n(one key was given; hack/guest/init counts the lines of meta_data.json that contain \"ssh-\", " +
		"and nova's layout, which the shim writes, has each key twice: in public_keys and in keys[].data)"
}

// checkDriveFiles reads the vfat config drive from the host and checks what
// the pod asked for is in it (meta and the pod IP only when given).
func checkDriveFiles(t *testing.T, image, uuid, hostname, key, userData string, meta map[string]string, podIP string) {
	t.Helper()
	b, err := readVFAT(image, "/openstack/latest/meta_data.json")
	if err != nil {
		t.Error(err)
		return
	}
	var md driveMetaData
	if err := json.Unmarshal(b, &md); err != nil {
		t.Fatalf("meta_data.json: %v\n%s", err, b)
	}
	var keys []string
	for _, k := range md.PublicKeys {
		keys = append(keys, k)
	}
	if md.UUID != uuid || md.Hostname != hostname || len(keys) != 1 || keys[0] != key {
		t.Errorf("meta_data.json has uuid %q hostname %q keys %q, want %q %q [%q]", md.UUID, md.Hostname, keys, uuid, hostname, key)
	}
	for k, v := range meta {
		if md.Meta[k] != v {
			t.Errorf("meta_data.json meta[%q] = %q, want %q (meta: %v)", k, md.Meta[k], v, md.Meta)
		}
	}
	if ud, err := readVFAT(image, "/openstack/latest/user_data"); err != nil || string(ud) != userData {
		t.Errorf("user_data on the drive is %q (%v), want %q", ud, err, userData)
	}
	if podIP == "" {
		return
	}
	if nd, err := readVFAT(image, "/openstack/latest/network_data.json"); err != nil || !bytes.Contains(nd, []byte(`"`+podIP+`"`)) {
		t.Errorf("network_data.json (%v) lacks the pod IP %s:\n%s", err, podIP, nd)
	}
}

// TestCtrConfigDrive checks the drive a plain ctr VM gets: the default vfat
// drive as the bios image's guest reads it (no pod, no network: hostname
// from the container id), iso9660 (a CD-ROM on a virtio-scsi controller,
// volume id config-2) and none at all (config-drive=false).
func TestCtrConfigDrive(t *testing.T) {
	s := requireKVM(t, "kernel", "bios")
	key := testSSHKey(t)
	// No comma and no trailing white space: ctr 2.x's --annotation flag
	// splits values at commas and trims them.
	userData := "#!/bin/sh\necho TestCtrConfigDrive"
	s.forEachFlavour(t, func(t *testing.T, c *containerd) {
		t.Run("vfat-bios", func(t *testing.T) {
			c.cleanupAfter(t)
			id := "it-drive-bios"
			f := c.runForeground(t, nsDefault, append([]string{
				"--annotation", annUserData + "=" + userData, "--annotation", annSSHKeys + "=" + key,
			}, c.kvmRun(c.suite.images["bios"].ref, id)...)...)
			f.waitOutput(t, guestDriveLine, bootTimeout)
			d := c.domainOf(t, id)
			var line string
			if err := poll(10*time.Second, func() (bool, string) {
				for _, l := range strings.Split(f.out.String(), "\n") {
					if i := strings.Index(l, guestDriveLine); i >= 0 && strings.Contains(l[i:], "userdata=") {
						line = strings.TrimSpace(l[i:])
						return true, ""
					}
				}
				return false, "no complete " + guestDriveLine + "line"
			}); err != nil {
				t.Fatal(err)
			}
			want := fmt.Sprintf("KVM-GUEST-CONFIGDRIVE hostname=%s uuid=%s keys=1 userdata=%d", id, d.UUID, len(userData))
			if line != want {
				t.Errorf("guest read its config drive as\n  %q\nwant\n  %q%s", line, want, keysHint(line))
			}
			if file, _, _ := d.configDrive(); file == "" {
				t.Errorf("no config drive in the domain:\n%s", d.raw)
			} else {
				checkDriveFiles(t, file, d.UUID, id, key, userData, nil, "")
			}
			c.mustCtr(t, nsDefault, "task", "kill", "-s", "KILL", id)
			if code := f.wait(t, stopTimeout); code != 137 {
				t.Errorf("ctr run exited %d after SIGKILL, want 137", code)
			}
			assertNothingLeft(t, c, shimID{nsDefault, id})
		})
		t.Run("iso9660", func(t *testing.T) {
			c.cleanupAfter(t)
			id := "it-drive-iso"
			d := c.runDetached(t, id, "kernel", annDriveFormat+"=iso9660")
			file, device, bus := d.configDrive()
			if device != "cdrom" || bus != "scsi" || filepath.Base(file) != "config-2.iso" {
				t.Errorf("config drive %q device %q bus %q, want config-2.iso as a cdrom on the scsi bus\n%s", file, device, bus, d.raw)
			}
			virtioSCSI := false
			for _, ctl := range d.Devices.Controllers {
				virtioSCSI = virtioSCSI || ctl.Type == "scsi" && ctl.Model == "virtio-scsi"
			}
			if !virtioSCSI {
				t.Errorf("no virtio-scsi controller for the config drive CD-ROM:\n%s", d.raw)
			}
			if file != "" {
				checkISOVolumeID(t, file, "config-2")
			}
			c.killAndDelete(t, id)
			assertNothingLeft(t, c, shimID{nsDefault, id})
		})
		t.Run("disabled", func(t *testing.T) {
			c.cleanupAfter(t)
			id := "it-drive-off"
			d := c.runDetached(t, id, "kernel", annDrive+"=false")
			if file, _, _ := d.configDrive(); file != "" || len(d.Devices.Disks) != 0 {
				t.Errorf("config-drive=false, yet the domain has disks (config drive %q):\n%s", file, d.raw)
			}
			c.killAndDelete(t, id)
			assertNothingLeft(t, c, shimID{nsDefault, id})
		})
	})
}

// checkISOVolumeID checks an ISO 9660 image's volume id: in the primary
// volume descriptor (sector 16) at byte 40, 32 bytes padded with spaces;
// and with isoinfo when it is installed.
func checkISOVolumeID(t *testing.T, file, want string) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Error(err)
		return
	}
	const pvd = 16 * 2048
	if len(b) < pvd+72 || string(b[pvd+1:pvd+6]) != "CD001" {
		t.Errorf("%s is not an ISO 9660 image (no CD001 at sector 16)", file)
		return
	}
	if got := strings.TrimRight(string(b[pvd+40:pvd+72]), " "); got != want {
		t.Errorf("%s: volume id %q at offset %d, want %q", file, got, pvd+40, want)
	}
	if _, err = exec.LookPath("isoinfo"); err != nil {
		return
	}
	out, err := exec.Command("isoinfo", "-d", "-i", file).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Volume id: "+want+"\n") {
		t.Errorf("isoinfo -d -i %s (%v) lacks \"Volume id: %s\":\n%s", file, err, want, out)
	}
}

// runDetached runs `ctr run -d` of image with the given annotations and
// returns the domain the shim defined once the task runs.
func (c *containerd) runDetached(t *testing.T, id, image string, annotations ...string) *domain {
	t.Helper()
	args := []string{"run", "-d"}
	for _, a := range annotations {
		args = append(args, "--annotation", a)
	}
	c.mustCtr(t, nsDefault, append(args, c.kvmRun(c.suite.images[image].ref, id)...)...)
	c.waitTaskStatus(t, nsDefault, id, "RUNNING", bootTimeout)
	return c.domainOf(t, id)
}

// killAndDelete destroys a detached VM and deletes its task and container.
func (c *containerd) killAndDelete(t *testing.T, id string) {
	t.Helper()
	c.mustCtr(t, nsDefault, "task", "kill", "-s", "KILL", id)
	c.waitTaskStatus(t, nsDefault, id, "STOPPED", stopTimeout)
	c.deleteTask(t, nsDefault, id, 137)
	c.mustCtr(t, nsDefault, "containers", "delete", id)
}
