package check

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/kvm-shim/containerd-shim-kvm-v1/cgroup"
)

// libvirtQEMUConf is where libvirtd reads cgroup_controllers.
const libvirtQEMUConf = "/etc/libvirt/qemu.conf"

// libvirtDefaultControllers is what libvirt manages when qemu.conf sets
// no cgroup_controllers (libvirt 9.0's default: all it knows).
var libvirtDefaultControllers = []string{"cpu", "devices", "memory", "blkio", "cpuset", "cpuacct"}

var cgroupControllersRE = regexp.MustCompile(`(?m)^[ \t]*cgroup_controllers[ \t]*=[ \t]*\[([^\]]*)\]`)

// libvirtCgroupControllers reads cgroup_controllers from a qemu.conf: the
// controllers libvirt manages for QEMU.
func libvirtCgroupControllers(conf []byte) ([]string, error) {
	m := cgroupControllersRE.FindAllSubmatch(conf, -1)
	if len(m) == 0 {
		return libvirtDefaultControllers, nil
	}
	// libvirt's parser keeps the last setting.
	var list []string
	for _, item := range strings.Split(string(m[len(m)-1][1]), ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if len(item) < 2 || item[0] != '"' || item[len(item)-1] != '"' {
			return nil, fmt.Errorf("cgroup_controllers item %s is not a quoted string", item)
		}
		list = append(list, item[1:len(item)-1])
	}
	return list, nil
}

// checkLibvirtCgroups tells whether libvirt leaves QEMU's accounting
// controllers to the shim: on cgroup v1 none of memory, cpu, cpuacct and
// pids; on cgroup v2 nothing at all (one hierarchy).
func checkLibvirtCgroups(h cgroup.Hierarchies, conf []byte) (checkLevel, string) {
	list, err := libvirtCgroupControllers(conf)
	if err != nil {
		return checkFail, fmt.Sprintf("%s: %v", libvirtQEMUConf, err)
	}
	want := `cgroup_controllers = [ "cpuset", "devices", "blkio" ]`
	var clash []string
	if h.Version() == 2 {
		want, clash = `cgroup_controllers = [ ]`, list
	} else {
		for _, c := range cgroup.V1Controllers {
			if slices.Contains(list, c) {
				clash = append(clash, c)
			}
		}
	}
	if len(clash) > 0 {
		return checkFail, fmt.Sprintf("libvirt manages %s for QEMU (%s) and would move vCPU threads out of the pod's cgroup: set %s "+
			"(hack/setup-host.sh does) and restart libvirtd",
			strings.Join(clash, ", "), libvirtQEMUConf, want)
	}
	return checkOK, fmt.Sprintf("cgroup v%d; libvirt manages [%s], the shim charges QEMU to the pod's cgroup", h.Version(),
		strings.Join(list, " "))
}

// checkCgroups is the `check` line for cgroups.
func checkCgroups() (checkLevel, string) {
	h, err := cgroup.Detect()
	if err != nil {
		return checkFail, err.Error()
	}
	conf, err := os.ReadFile(libvirtQEMUConf)
	if err != nil {
		return checkFail, fmt.Sprintf("read libvirt's %v", err)
	}
	return checkLibvirtCgroups(h, conf)
}
