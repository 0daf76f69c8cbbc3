// Package cloudimage holds the full-guest proof of the config drive: the
// Debian cloud image built by build.sh boots under QEMU (TCG) from its
// containerDisk qcow2 with a config drive from package configdrive, and
// cloud-init applies hostname, SSH key, static network and user-data.
package cloudimage

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
	"github.com/kvm-shim/containerd-shim-kvm-v1/configdrive"
)

const (
	guestMAC = "52:54:00:c1:0d:01"
	// bootTimeout bounds one boot to KVM-CLOUD-DONE; about 70 s are usual
	// under TCG on 2 cores.
	bootTimeout = 8 * time.Minute
)

// repoRoot is two levels up from this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(wd, "..", "..")
}

// cloudDisk returns the qcow2 to boot: the one inside the OCI archive
// _output/images/cloud.tar (its containerDisk /disk/cloud.qcow2, extracted
// into dir), else _output/cloudimage/cloud.qcow2. When neither exists: in
// CI (CI set) or with KVM_CLOUDIMAGE_BUILD=1, as root, build.sh makes them
// (a few minutes, needs the Debian mirror); otherwise the test skips.
// KVM_CLOUDIMAGE_QCOW2 names another disk.
func cloudDisk(t *testing.T, dir string) string {
	t.Helper()
	if p := os.Getenv("KVM_CLOUDIMAGE_QCOW2"); p != "" {
		return p
	}
	root := repoRoot(t)
	archive := filepath.Join(root, "_output", "images", "cloud.tar")
	disk := filepath.Join(root, "_output", "cloudimage", "cloud.qcow2")
	_, errArchive := os.Stat(archive)
	_, errDisk := os.Stat(disk)
	if errArchive != nil && errDisk != nil {
		if os.Getenv("CI") == "" && os.Getenv("KVM_CLOUDIMAGE_BUILD") != "1" {
			t.Skipf("no %s: run hack/cloudimage/build.sh (as root), or set KVM_CLOUDIMAGE_BUILD=1", archive)
		}
		if os.Getuid() != 0 {
			t.Skip("the cloud image is missing and building it needs root")
		}
		t.Logf("building the cloud image (hack/cloudimage/build.sh)")
		cmd := exec.Command(filepath.Join(root, "hack", "cloudimage", "build.sh"))
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		t.Logf("build.sh:\n%s", out)
		if err != nil {
			t.Fatalf("build.sh: %v", err)
		}
		_, errArchive = os.Stat(archive)
	}
	if errArchive != nil {
		t.Logf("no %s: booting %s", archive, disk)
		return disk
	}
	dest := filepath.Join(dir, "cloud.qcow2")
	if err := diskFromArchive(archive, dest); err != nil {
		t.Fatalf("containerDisk from %s: %v", archive, err)
	}
	t.Logf("booting /disk/cloud.qcow2 of %s", archive)
	return dest
}

// diskFromArchive copies the single /disk/*.qcow2 of the single-layer OCI
// image archive (hack/ocipack's format) to dest.
func diskFromArchive(archive, dest string) error {
	// Pass 1: the small JSON blobs, to find the layer.
	small := map[string][]byte{}
	if err := walkTar(archive, func(name string, size int64, r io.Reader) (bool, error) {
		if size > 1<<20 {
			return false, nil
		}
		b, err := io.ReadAll(r)
		small[name] = b
		return false, err
	}); err != nil {
		return err
	}
	blob := func(d string) string { return "blobs/sha256/" + strings.TrimPrefix(d, "sha256:") }
	var index struct {
		Manifests []struct{ Digest string } `json:"manifests"`
	}
	if err := json.Unmarshal(small["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		return fmt.Errorf("index.json: %v (%d manifests)", err, len(index.Manifests))
	}
	var manifest struct {
		Layers []struct{ Digest string } `json:"layers"`
	}
	if err := json.Unmarshal(small[blob(index.Manifests[0].Digest)], &manifest); err != nil || len(manifest.Layers) != 1 {
		return fmt.Errorf("manifest: %v (%d layers)", err, len(manifest.Layers))
	}
	layer := blob(manifest.Layers[0].Digest)
	// Pass 2: stream the layer and copy the disk out of it.
	found := false
	err := walkTar(archive, func(name string, _ int64, r io.Reader) (bool, error) {
		if name != layer {
			return false, nil
		}
		gz, err := gzip.NewReader(r)
		if err != nil {
			return true, err
		}
		tr := tar.NewReader(gz)
		for {
			hdr, err := tr.Next()
			if errors.Is(err, io.EOF) {
				return true, nil
			}
			if err != nil {
				return true, err
			}
			if hdr.Typeflag != tar.TypeReg || !strings.HasPrefix(path.Clean("/"+hdr.Name), "/disk/") || !strings.HasSuffix(hdr.Name, ".qcow2") {
				continue
			}
			f, err := os.Create(dest)
			if err != nil {
				return true, err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			found = true
			return true, err
		}
	})
	if err == nil && !found {
		err = fmt.Errorf("no /disk/*.qcow2 in layer %s", layer)
	}
	return err
}

// walkTar calls fn for each regular file of the tar file at p until fn
// says stop.
func walkTar(p string, fn func(name string, size int64, r io.Reader) (stop bool, err error)) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		stop, err := fn(hdr.Name, hdr.Size, tr)
		if err != nil || stop {
			return err
		}
	}
}

func requireQEMU(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: the full-guest boot takes minutes under TCG")
	}
	for _, tool := range []string{"qemu-system-x86_64", "qemu-img"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found (apt-get install qemu-system-x86 qemu-utils)", tool)
		}
	}
}

// newKey returns a fresh OpenSSH public key line.
func newKey(t *testing.T) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sp, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp))) + " boot-test@kvm-shim"
}

// console is what the test expects on the guest's serial console.
type console map[string][]string // KVM-CLOUD-<WHAT> → values, in order

// parseConsole collects the "KVM-CLOUD-<WHAT> <value>" lines of a serial log.
func parseConsole(log []byte) console {
	c := console{}
	sc := bufio.NewScanner(bytes.NewReader(log))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(strings.ReplaceAll(sc.Text(), "\r", ""))
		i := strings.Index(line, "KVM-CLOUD-")
		if i != 0 {
			continue
		}
		what, value, _ := strings.Cut(line[len("KVM-CLOUD-"):], " ")
		c[what] = append(c[what], value)
	}
	return c
}

func TestCloudImageBootsWithConfigDriveVFAT(t *testing.T) {
	bootAndCheck(t, configdrive.FormatVFAT)
}

// The iso9660 drive as a virtio-scsi cdrom: opt-in (KVM_CLOUDIMAGE_ISO=1),
// it costs another boot.
func TestCloudImageBootsWithConfigDriveISO9660(t *testing.T) {
	if os.Getenv("KVM_CLOUDIMAGE_ISO") != "1" {
		t.Skip("set KVM_CLOUDIMAGE_ISO=1 to boot with an iso9660 drive too")
	}
	bootAndCheck(t, configdrive.FormatISO9660)
}

func bootAndCheck(t *testing.T, format configdrive.Format) {
	requireQEMU(t)
	root := repoRoot(t)
	dir := t.TempDir()
	disk := cloudDisk(t, dir)

	// The pod's view: annotations, a name, a uid, an interface.
	userData, err := os.ReadFile(filepath.Join(root, "hack", "cloudimage", "user-data.sh"))
	if err != nil {
		t.Fatal(err)
	}
	key := newKey(t)
	opts, err := configdrive.FromAnnotations(map[string]string{
		annotations.UserData:          string(userData),
		annotations.SSHAuthorizedKeys: key,
		annotations.Metadata:          `{"test": "boot"}`,
	}, format)
	if err != nil {
		t.Fatal(err)
	}
	mac, _ := net.ParseMAC(guestMAC)
	// QEMU's user network (restrict=on: nothing leaves the host) has the
	// guest at 10.0.2.15, gateway 10.0.2.2, DNS 10.0.2.3. Its IPv6 is off
	// (no router advertisements): the static IPv6 address and route on a
	// private prefix prove that cloud-init applied them.
	network, err := configdrive.NewNetwork(mac, 1500,
		[]netip.Prefix{netip.MustParsePrefix("10.0.2.15/24"), netip.MustParsePrefix("fd00:c10d::15/64")},
		[]configdrive.Route{
			{Dst: netip.MustParsePrefix("0.0.0.0/0"), Gateway: netip.MustParseAddr("10.0.2.2")},
			{Dst: netip.MustParsePrefix("::/0"), Gateway: netip.MustParseAddr("fd00:c10d::1")},
		},
		[]netip.Addr{netip.MustParseAddr("10.0.2.3")})
	if err != nil {
		t.Fatal(err)
	}
	network.Search = []string{"default.svc.cluster.local", "svc.cluster.local"}
	inst := configdrive.Instance{
		UUID: configdrive.StableUUID("0b6f7d8e-5c4a-4f3e-9a1b-2c3d4e5f6a7b", "vm"),
		Name: "Cloud_Test.web-0",
	}
	drive := filepath.Join(dir, "config-drive.img")
	start := time.Now()
	d := configdrive.Drive{Dir: dir, Out: drive, Instance: inst, Network: network, Options: opts}
	if err := d.Build(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Logf("config drive (%s) built in %v", format, time.Since(start).Round(time.Microsecond))

	overlay := filepath.Join(dir, "overlay.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", disk, overlay).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v\n%s", err, out)
	}

	logPath := filepath.Join(dir, "console.log")
	args := []string{
		"-accel", "tcg", "-machine", "q35", "-m", "1024", "-smp", "1",
		"-display", "none", "-monitor", "none", "-no-reboot",
		"-serial", "file:" + logPath,
		"-drive", "file=" + overlay + ",if=virtio,format=qcow2",
		"-netdev", "user,id=n0,restrict=on,ipv6=off",
		"-device", "virtio-net-pci,netdev=n0,mac=" + guestMAC,
	}
	if format == configdrive.FormatVFAT {
		args = append(args, "-drive", "file="+drive+",if=virtio,format=raw,readonly=on")
	} else {
		args = append(args, "-device", "virtio-scsi-pci,id=scsi0",
			"-drive", "file="+drive+",if=none,id=cd0,format=raw,media=cdrom,readonly=on",
			"-device", "scsi-cd,bus=scsi0.0,drive=cd0")
	}
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	qemu := exec.CommandContext(ctx, "qemu-system-x86_64", args...)
	var qemuOut bytes.Buffer
	qemu.Stdout, qemu.Stderr = &qemuOut, &qemuOut
	boot := time.Now()
	if err := qemu.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- qemu.Wait() }()
	running := true
	defer func() {
		if running {
			_ = qemu.Process.Kill() // only the QEMU this test started
			<-exited                //nolint:errcheck // the exit status of a QEMU killed here
		}
		if t.Failed() {
			log, _ := os.ReadFile(logPath)
			t.Logf("serial console:\n%s", log)
		}
	}()

	var c console
	var ranAfter time.Duration
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
wait:
	for {
		select {
		case err := <-exited:
			running = false
			t.Fatalf("QEMU exited before KVM-CLOUD-DONE: %v\n%s", err, qemuOut.Bytes())
		case <-tick.C:
			log, _ := os.ReadFile(logPath)
			c = parseConsole(log)
			if ranAfter == 0 && len(c["USERDATA-RAN"]) > 0 {
				ranAfter = time.Since(boot)
			}
			if len(c["DONE"]) > 0 {
				break wait
			}
			if ctx.Err() != nil {
				t.Fatalf("no KVM-CLOUD-DONE on the console within %v", bootTimeout)
			}
		}
	}
	t.Logf("boot to KVM-CLOUD-USERDATA-RAN: %v, to KVM-CLOUD-DONE: %v (guest uptime %s s)",
		ranAfter.Round(100*time.Millisecond), time.Since(boot).Round(100*time.Millisecond), strings.Join(c["UPTIME"], ""))
	whats := make([]string, 0, len(c))
	for what := range c {
		whats = append(whats, what)
	}
	sort.Strings(whats)
	for _, what := range whats {
		t.Logf("KVM-CLOUD-%s %q", what, c[what])
	}

	want := func(what, value string) {
		t.Helper()
		for _, v := range c[what] {
			if v == value {
				return
			}
		}
		t.Errorf("console: no KVM-CLOUD-%s %q (got %q)", what, value, c[what])
	}
	want("HOSTNAME", "cloud-test-web-0")
	want("INSTANCE-ID", inst.UUID)
	want("ADDR", "10.0.2.15/24")
	want("ADDR", "fd00:c10d::15/64")
	want("GW4", "10.0.2.2")
	want("GW6", "fd00:c10d::1")
	want("DNS", "10.0.2.3")
	want("SEARCH", "default.svc.cluster.local")
	want("SEARCH", "svc.cluster.local")
	want("SSHKEY", key)
}
