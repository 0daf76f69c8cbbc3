//go:build integration

package integration

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// The attacks of docs/security-isolation.md: a QEMU that a guest escaped
// into, and a local user without privileges, try to open what belongs
// to a VM that is not theirs. Each probe runs as a real process under
// the attacker's uid (openAs), so the kernel's checks decide, not a
// reading of modes.

// openAsEnv makes the integration test binary an opener (openAsMain)
// instead of a test run.
const openAsEnv = "KVM_IT_OPENAS"

// nobodyUID is the unprivileged local user of the attacks.
const nobodyUID = 65534

// openAsMain opens each path given (connects, for a socket) for reading
// and for writing, and prints a JSON map of path to "ok" (either
// worked) or the error of the read. It is what the test binary does when run with
// openAsEnv set under an attacker's uid.
func openAsMain(paths []string) int {
	res := map[string]string{}
	for _, p := range paths {
		res[p] = tryOpen(p)
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		return 1
	}
	return 0
}

func tryOpen(p string) string {
	if st, err := os.Stat(p); err == nil && st.Mode().Type() == os.ModeSocket {
		c, err := net.Dial("unix", p)
		if err != nil {
			return err.Error()
		}
		c.Close()
		return "ok"
	}
	var first error
	for _, flag := range []int{os.O_RDONLY, os.O_WRONLY} {
		f, err := os.OpenFile(p, flag|syscall.O_NONBLOCK, 0)
		if err == nil {
			f.Close()
			return "ok"
		}
		if first == nil {
			first = err
		}
	}
	return first.Error()
}

var (
	openAsOnce sync.Once
	openAsBin  string
	openAsErr  error
)

// openAs runs the opener as uid:uid with no supplementary groups and
// returns what each path gave. The test binary is copied where every
// user may run it (go test keeps it in a root-only dir).
func openAs(t *testing.T, s *testSuite, uid uint32, paths []string) map[string]string {
	t.Helper()
	openAsOnce.Do(func() {
		openAsBin = filepath.Join(s.binDir, "kvm-it-openas")
		src, err := os.Open(os.Args[0])
		if err != nil {
			openAsErr = err
			return
		}
		defer src.Close()
		dst, err := os.OpenFile(openAsBin, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
		if err != nil {
			openAsErr = err
			return
		}
		_, openAsErr = io.Copy(dst, src)
		openAsErr = errors.Join(openAsErr, dst.Close())
	})
	if openAsErr != nil {
		t.Fatalf("copy the opener: %v", openAsErr)
	}
	cmd := exec.Command(openAsBin, paths...)
	cmd.Env = []string{openAsEnv + "=1"}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("opener as uid %d: %v (%s)", uid, err, out)
	}
	res := map[string]string{}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("opener as uid %d: %v: %s", uid, err, out)
	}
	return res
}

// vmFiles is what a running VM has on the host, read from its live
// domain XML: the files an attacker would go for.
type vmFiles struct {
	domain   string
	uid      uint32
	qemuPid  int
	vmDir    string
	overlay  string   // "" for direct kernel boot
	drive    string   // config drive
	console  string   // console socket
	log      string   // console log
	volumes  []string // volume disks as QEMU opens them (block devices, pinned disk.img)
	fdSocket string   // network descriptor socket
}

// all lists every file of v an outsider must not open.
func (v vmFiles) all() []string {
	out := []string{v.vmDir, v.drive, v.console, v.log, v.fdSocket}
	if v.overlay != "" {
		out = append(out, v.overlay)
	}
	return append(out, v.volumes...)
}

func (c *containerd) vmFilesOf(t *testing.T, cid string) vmFiles {
	t.Helper()
	doms, err := c.ownDomains()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range doms {
		out, err := virsh("dumpxml", name)
		if err != nil {
			t.Fatalf("virsh dumpxml %s: %v", name, err)
		}
		var d struct {
			Meta struct {
				ContainerID string `xml:"container-id"`
				StateDir    string `xml:"state-dir"`
			} `xml:"metadata>vm"`
			Disks []struct {
				Source struct {
					File string `xml:"file,attr"`
					Dev  string `xml:"dev,attr"`
				} `xml:"source"`
				Target struct {
					Dev string `xml:"dev,attr"`
				} `xml:"target"`
			} `xml:"devices>disk"`
			Serial struct {
				Source struct {
					Path string `xml:"path,attr"`
				} `xml:"source"`
				Log struct {
					File string `xml:"file,attr"`
				} `xml:"log"`
			} `xml:"devices>serial"`
		}
		if xmlErr := xml.Unmarshal([]byte(out), &d); xmlErr != nil {
			t.Fatalf("domain %s: %v", name, xmlErr)
		}
		if d.Meta.ContainerID != cid {
			continue
		}
		v := vmFiles{domain: name, vmDir: d.Meta.StateDir, console: d.Serial.Source.Path, log: d.Serial.Log.File,
			fdSocket: filepath.Join(netfdSocketDir, name+".sock")}
		v.uid = dacUID(t, name, out)
		for _, disk := range d.Disks {
			src := disk.Source.File + disk.Source.Dev
			switch {
			case disk.Target.Dev == "vda" && strings.HasSuffix(src, "overlay.qcow2"):
				v.overlay = src
			case disk.Target.Dev == "vdz" || disk.Target.Dev == "sdz":
				v.drive = src
			default:
				v.volumes = append(v.volumes, src)
			}
		}
		b, err := os.ReadFile(filepath.Join("/run/libvirt/qemu", name+".pid"))
		if err != nil {
			t.Fatal(err)
		}
		if v.qemuPid, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
			t.Fatal(err)
		}
		return v
	}
	t.Fatalf("no domain of container %s among %v", cid, doms)
	return vmFiles{}
}

// processIDs reads a process's real, effective, saved and fs uids, and
// its status lines for privileges.
func processStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			out[k] = strings.Join(strings.Fields(v), " ")
		}
	}
	return out
}

// TestCRIIsolation runs two VM pods with volumes, A (direct kernel
// boot) and B (a disk image, so it has an overlay), and attacks: as A's
// QEMU uid, B's overlay, config drive, console socket and log, volume
// disks, descriptor socket and VM dir; as nobody, every file of both.
// Each attack must fail with the kernel's permission check, while A's
// uid opens A's own files (the probe can succeed). Then A's pod goes:
// its uid is freed, and a new pod does not get it back while others of
// the range are free (nor B's, which is still live).
func TestCRIIsolation(t *testing.T) {
	s := requireKVM(t, "kernel", "bios", "pause")
	s.forEachFlavour(t, func(t *testing.T, c *containerd) {
		c.cleanupAfter(t)
		cl := c.cri(t)
		withVolumes := func(name, image string) *podContainer {
			pvc := hostVolumeDir(t, "pvc")
			cfg := containerConfig("vm", image, map[string]string{annDiskImages: "/data=8Mi"})
			cfg.Devices = []*cri.Device{{ContainerPath: "/dev/xvda", HostPath: loopDevice(t, 8<<20, "KVM-GUEST-BLOCK "+name+"\n"),
				Permissions: "rwm"}}
			cfg.Mounts = []*cri.Mount{{ContainerPath: "/data", HostPath: pvc}}
			return c.startVolumePod(t, cl, name, cfg)
		}
		a := withVolumes("vm-iso-a", s.images["kernel"].ref)
		b := withVolumes("vm-iso-b", s.images["bios"].ref)
		// The attacks need the QEMUs running (StartContainer returned),
		// not the guests booted.
		fa, fb := c.vmFilesOf(t, a.cid), c.vmFilesOf(t, b.cid)
		if fa.uid == fb.uid {
			t.Fatalf("both VMs run under uid %d", fa.uid)
		}
		if fb.overlay == "" || fa.drive == "" || fb.drive == "" || len(fa.volumes) != 2 || len(fb.volumes) != 2 {
			t.Fatalf("VM files not found: A %+v, B %+v", fa, fb)
		}
		for _, v := range []vmFiles{fa, fb} {
			st := processStatus(t, v.qemuPid)
			want := fmt.Sprintf("%d %d %d %d", v.uid, v.uid, v.uid, v.uid)
			if st["Uid"] != want || st["Gid"] != want || st["CapEff"] != "0000000000000000" || st["NoNewPrivs"] != "1" || st["Seccomp"] != "2" {
				t.Errorf("QEMU of %s (pid %d): Uid %q Gid %q CapEff %q NoNewPrivs %q Seccomp %q; want uid and gid %d everywhere, no "+
					"capabilities, no_new_privs and a seccomp filter",
					v.domain, v.qemuPid, st["Uid"], st["Gid"], st["CapEff"], st["NoNewPrivs"], st["Seccomp"], v.uid)
			}
		}
		t.Logf("A: %s uid %d; B: %s uid %d", fa.domain, fa.uid, fb.domain, fb.uid)

		// The probe can succeed: A's uid opens A's own files. A's block
		// device stays root:disk on the host: with qemu.conf's mount
		// namespace libvirt labels the node in QEMU's private /dev.
		ownFiles := []string{fa.drive, fa.console}
		for _, p := range fa.volumes {
			if !strings.HasPrefix(p, "/dev/") {
				ownFiles = append(ownFiles, p)
			}
		}
		own := openAs(t, s, fa.uid, ownFiles)
		for p, r := range own {
			if r != "ok" {
				t.Errorf("A's uid cannot open A's own %s: %s (the attacks below would prove nothing)", p, r)
			}
		}
		// A's QEMU against B.
		for p, r := range openAs(t, s, fa.uid, fb.all()) {
			if !strings.Contains(r, "permission denied") {
				t.Errorf("as A's QEMU uid %d, B's %s: %s; want permission denied", fa.uid, p, r)
			}
		}
		// Inside A's QEMU mount namespace, where an escaped guest is, B's
		// block devices do not exist; A's own do.
		for _, p := range fb.volumes {
			if strings.HasPrefix(p, "/dev/") {
				if _, err := os.Stat(fmt.Sprintf("/proc/%d/root%s", fa.qemuPid, p)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("B's block device %s in A's QEMU mount namespace: %v; want none", p, err)
				}
			}
		}
		for _, p := range fa.volumes {
			if strings.HasPrefix(p, "/dev/") {
				if _, err := os.Stat(fmt.Sprintf("/proc/%d/root%s", fa.qemuPid, p)); err != nil {
					t.Errorf("A's own block device %s is not in A's QEMU mount namespace: %v", p, err)
				}
			}
		}
		// A local user against both.
		for p, r := range openAs(t, s, nobodyUID, append(fa.all(), fb.all()...)) {
			if !strings.Contains(r, "permission denied") {
				t.Errorf("as nobody, %s: %s; want permission denied", p, r)
			}
		}

		// A goes: its uid is freed; the next VM takes neither it nor B's.
		// (Removed without a clean power-off: the guests need not have
		// booted, and a guest that ignores ACPI is killed.)
		killAndRemove(t, cl, a)
		held, err := testenv.HostIDs(s.idStateFile)
		if err != nil {
			t.Fatal(err)
		}
		for o, id := range held {
			if id == fa.uid {
				t.Errorf("A's uid %d is still allocated (to %s) after its pod went", fa.uid, o)
			}
		}
		cnext := c.startPodContainer(t, cl, "vm-iso-c", "kvm", s.images["kernel"].ref)
		fc := c.vmFilesOf(t, cnext.cid)
		if fc.uid == fb.uid || fc.uid == fa.uid {
			t.Errorf("the next VM got uid %d (A had %d, B has %d): a freed id must come back only after the rest of the range", fc.uid,
				fa.uid, fb.uid)
		}
		ids := append(a.shimIDs(), b.shimIDs()...)
		for _, v := range []*podContainer{b, cnext} {
			killAndRemove(t, cl, v)
			ids = append(ids, v.shimIDs()...)
		}
		assertNothingLeft(t, c, ids...)
	})
}

// killAndRemove stops v's VM at once (a destroy) and removes its pod.
func killAndRemove(t *testing.T, cl *criClient, v *podContainer) {
	t.Helper()
	ctx, cancel := criCtx()
	defer cancel()
	if _, err := cl.Runtime.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: v.cid, Timeout: 0}); err != nil {
		t.Errorf("StopContainer %s: %v", v.cid, err)
	}
	cl.removePod(t, v)
}

// domainUID is the uid a domain's QEMU runs under, from its static DAC
// label.
func domainUID(t *testing.T, name string) uint32 {
	t.Helper()
	out, err := virsh("dumpxml", name)
	if err != nil {
		t.Fatalf("virsh dumpxml %s: %v", name, err)
	}
	return dacUID(t, name, out)
}

// dacUID is the uid of a domain's static DAC label (vm.IdentityFromXML,
// which the shim's sweep reads too); a domain without one fails t.
func dacUID(t *testing.T, name, domainXML string) uint32 {
	t.Helper()
	id, err := vm.IdentityFromXML(domainXML)
	if err != nil {
		t.Fatalf("domain %s: DAC label: %v", name, err)
	}
	if id == nil || id.UID == 0 {
		t.Fatalf("domain %s has no static DAC label: its QEMU runs under the shared user", name)
	}
	return id.UID
}
