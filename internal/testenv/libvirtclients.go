package testenv

import (
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// LibvirtClientPids is the set of peer pids of libvirtd's local (unix
// socket) clients, as virt-admin reports them: which processes hold a
// connection to libvirtd now.
func LibvirtClientPids() (map[int]bool, error) {
	out, err := exec.Command("virt-admin", "client-list", "libvirtd").Output()
	if err != nil {
		return nil, fmt.Errorf("virt-admin client-list libvirtd: %w", err)
	}
	pids := map[int]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[1] != "unix" {
			continue
		}
		info, err := exec.Command("virt-admin", "client-info", "libvirtd", f[0]).Output()
		if err != nil {
			continue // the client left meanwhile
		}
		if pid, ok := clientPid(string(info)); ok {
			pids[pid] = true
		}
	}
	return pids, nil
}

// clientPid reads unix_process_id from virt-admin client-info's output.
func clientPid(info string) (int, bool) {
	for _, l := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "unix_process_id" {
			pid, err := strconv.Atoi(strings.TrimSpace(v))
			return pid, err == nil
		}
	}
	return 0, false
}
