package check

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/kvm-shim/containerd-shim-kvm-v1/hostid"
	"github.com/kvm-shim/containerd-shim-kvm-v1/shim"
)

// What `check` reports of QEMU's confinement: libvirt's settings in
// qemu.conf (read, never changed), the host's LSM, and the per-VM
// identity range with what of it is in use or collides with a user.

// confineHost is what the confinement checks read from the host.
type confineHost struct {
	qemuConf      []byte // /etc/libvirt/qemu.conf
	cgroupV2      bool
	lsm           string // /sys/kernel/security/lsm ("" when absent)
	passwd, group []byte // /etc/passwd, /etc/group
	domainDirs    map[string]os.FileMode
}

func readConfineHost() confineHost {
	h := confineHost{domainDirs: map[string]os.FileMode{}}
	h.qemuConf, _ = os.ReadFile(libvirtQEMUConf)
	var st = func(p string) bool { _, err := os.Stat(p); return err == nil }
	h.cgroupV2 = st("/sys/fs/cgroup/cgroup.controllers")
	if b, err := os.ReadFile("/sys/kernel/security/lsm"); err == nil {
		h.lsm = strings.TrimSpace(string(b))
	}
	h.passwd, _ = os.ReadFile("/etc/passwd")
	h.group, _ = os.ReadFile("/etc/group")
	for _, d := range shim.LibvirtDomainDirs {
		if fi, err := os.Stat(d); err == nil {
			h.domainDirs[d] = fi.Mode().Perm()
		}
	}
	return h
}

// qemuConfValue returns the last uncommented setting of key in a
// qemu.conf (libvirt keeps the last), its raw value; ok false when unset.
func qemuConfValue(conf []byte, key string) (string, bool) {
	re := regexp.MustCompile(`(?m)^[ \t]*` + regexp.QuoteMeta(key) + `[ \t]*=[ \t]*(\[[^\]]*\]|[^\n#]*)`)
	m := re.FindAllSubmatch(conf, -1)
	if len(m) == 0 {
		return "", false
	}
	return strings.TrimSpace(string(m[len(m)-1][1])), true
}

// confinementChecks judges QEMU's confinement from h; ids is the per-VM
// identity range (nil: off) with inUse of it allocated.
func confinementChecks(h confineHost, ids *hostid.Range, inUse int) []checkResult {
	var c checkList
	c.checkQEMUConf(h)
	if v, set := qemuConfValue(h.qemuConf, "dynamic_ownership"); set && v == "0" && ids != nil {
		c.add(checkFail, "identities",
			"qemu.conf dynamic_ownership = 0: libvirt would not give a VM's disks to its own uid, and its QEMU could not open them")
		return c
	}

	switch {
	case h.lsm == "" || !(strings.Contains(h.lsm, "apparmor") || strings.Contains(h.lsm, "selinux")):
		c.add(checkOK, "lsm",
			"no AppArmor or SELinux (lsm: %s): VMs are kept apart by their uids, modes and QEMU's own confinement", orNone(h.lsm))
	default:
		c.add(checkOK, "lsm", "%s: libvirt's dynamic sVirt label confines each QEMU on top of its uid", h.lsm)
	}
	c.checkIdentities(h, ids, inUse)
	return c
}

// checkQEMUConf judges libvirt's qemu.conf: QEMU's seccomp sandbox, its
// mount namespace, the device cgroup and the user it runs as.
func (c *checkList) checkQEMUConf(h confineHost) {
	switch v, set := qemuConfValue(h.qemuConf, "seccomp_sandbox"); {
	case !set || v == "1":
		c.add(checkOK, "seccomp", "QEMU runs with its seccomp sandbox (qemu.conf seccomp_sandbox %s)", setOrDefault(set, v))
	default:
		c.add(checkWarn, "seccomp", "qemu.conf seccomp_sandbox = %s: QEMU runs without its seccomp sandbox; remove the line or set 1", v)
	}

	switch v, set := qemuConfValue(h.qemuConf, "namespaces"); {
	case !set || strings.Contains(v, `"mount"`):
		c.add(checkOK, "namespaces",
			"each QEMU gets a private mount namespace with a /dev of its own devices only (qemu.conf namespaces %s)", setOrDefault(set, v))
	default:
		c.add(checkWarn, "namespaces", "qemu.conf namespaces = %s: QEMU sees the host's /dev and mounts; set [ \"mount\" ]", v)
	}

	ctrls, err := libvirtCgroupControllers(h.qemuConf)
	switch {
	case err != nil:
		c.add(checkWarn, "device ACL", "qemu.conf: %v", err)
	case h.cgroupV2 && len(ctrls) == 0:
		c.add(checkWarn, "device ACL",
			"cgroup v2 with cgroup_controllers = [ ]: libvirt sets no device filter; QEMU's reach to host devices rests on its uid and "+
				"mount namespace")
	case h.cgroupV2 || slices.Contains(ctrls, "devices"):
		c.add(checkOK, "device ACL", "libvirt's device cgroup lets each QEMU open only its own disks plus qemu.conf's cgroup_device_acl")
	default:
		c.add(checkWarn, "device ACL", "qemu.conf cgroup_controllers lacks \"devices\": QEMU's device access is not limited by cgroup")
	}

	if v, set := qemuConfValue(h.qemuConf, "user"); set && strings.Trim(v, `"`) == "root" {
		c.add(checkWarn, "qemu user", "qemu.conf user = %s: VMs without an identity of their own run QEMU as root", v)
	}
}

// checkIdentities judges the per-VM identity range: off, clashing with
// the node's users or groups, or in use; and whether QEMU under an
// identity of its own can reach libvirt's domain dirs.
func (c *checkList) checkIdentities(h confineHost, ids *hostid.Range, inUse int) {
	if ids == nil {
		c.add(checkWarn, "identities",
			"vm_id_range = \"\": every VM's QEMU runs as qemu_user, one uid for all; a QEMU that a guest escaped into can open every "+
				"other VM's disks")
		return
	}
	if clashes := idClashes(h, ids); len(clashes) > 0 {
		c.add(checkFail, "identities", "vm_id_range %s holds ids of the node's %s: a VM's QEMU would share them; choose another range",
			ids, strings.Join(clashes, ", "))
	} else {
		c.add(checkOK, "identities",
			"each VM's QEMU runs under its own uid:gid from %s (%d ids, %d in use); VM files are that uid's alone", ids, ids.Size(), inUse)
	}
	for _, d := range shim.LibvirtDomainDirs {
		if m, ok := h.domainDirs[d]; ok && m&0o001 == 0 {
			c.add(checkWarn, "identities",
				"%s is %#o: a QEMU under its own uid cannot reach its domain dir (the shim gives it o+x when it starts; "+
					"hack/setup-host.sh adds a dpkg statoverride)", d, m)
		}
	}
}

// idClashes names the users and groups of h whose ids lie in ids.
func idClashes(h confineHost, ids *hostid.Range) []string {
	var clashes []string
	for _, f := range []struct {
		what string
		b    []byte
	}{{"user", h.passwd}, {"group", h.group}} {
		sc := bufio.NewScanner(bytes.NewReader(f.b))
		for sc.Scan() {
			fields := strings.Split(sc.Text(), ":")
			if len(fields) < 3 {
				continue
			}
			if n, err := strconv.ParseUint(fields[2], 10, 32); err == nil && ids.Contains(uint32(n)) {
				clashes = append(clashes, fmt.Sprintf("%s %s (%d)", f.what, fields[0], n))
			}
		}
	}
	return clashes
}

func setOrDefault(set bool, v string) string {
	if !set {
		return "default"
	}
	return "= " + v
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
