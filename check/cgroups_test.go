package check

import (
	"strings"
	"testing"

	"github.com/kvm-shim/containerd-shim-kvm-v1/cgroup"
)

func TestCheckLibvirtCgroups(t *testing.T) {
	v1 := cgroup.Hierarchies{V1: map[string]string{"memory": "/m", "cpu": "/c", "cpuacct": "/a", "pids": "/p"}}
	v2 := cgroup.Hierarchies{Unified: "/sys/fs/cgroup"}
	for _, c := range []struct {
		name string
		h    cgroup.Hierarchies
		conf string
		want checkLevel
		note string
	}{
		{"v1 default", v1, "#cgroup_controllers = [ \"cpu\" ]\n", checkFail, "memory, cpu, cpuacct for"},
		{"v1 setup's", v1, "cgroup_controllers = [ \"cpuset\", \"devices\", \"blkio\" ]\n", checkOK, "[cpuset devices blkio]"},
		{"v1 none", v1, "cgroup_controllers = [ ]\n", checkOK, "cgroup v1"},
		{"v1 pids", v1, "cgroup_controllers = [ \"pids\",\n  \"cpuset\" ]\n", checkFail, "manages pids"},
		{"v1 last wins", v1, "cgroup_controllers = [ \"memory\" ]\ncgroup_controllers = [ \"cpuset\" ]\n", checkOK, "[cpuset]"},
		{"v2 cpuset", v2, "cgroup_controllers = [ \"cpuset\" ]\n", checkFail, "cgroup_controllers = [ ]"},
		{"v2 none", v2, "cgroup_controllers = []\n", checkOK, "cgroup v2"},
		{"unquoted", v1, "cgroup_controllers = [ cpuset ]\n", checkFail, "not a quoted string"},
	} {
		got, note := checkLibvirtCgroups(c.h, []byte(c.conf))
		if got != c.want || !strings.Contains(note, c.note) {
			t.Errorf("%s: %s %q; want %s containing %q", c.name, got, note, c.want, c.note)
		}
	}
}
