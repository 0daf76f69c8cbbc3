package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
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

// ShimsConnected tells whether this daemon has exactly n shims and each
// is a client of libvirtd, for a poll: their pids, and what is missing
// while not.
func (c *Containerd) ShimsConnected(n int) (pids []int, ok bool, status string) {
	for _, p := range c.ShimProcesses() {
		pids = append(pids, p.Pid)
	}
	if len(pids) != n {
		return pids, false, fmt.Sprintf("%d shim processes, want %d", len(pids), n)
	}
	clients, err := LibvirtClientPids()
	if err != nil {
		return pids, false, err.Error()
	}
	var missing []int
	for _, p := range pids {
		if !clients[p] {
			missing = append(missing, p)
		}
	}
	return pids, len(missing) == 0, fmt.Sprintf("shims %v not connected to libvirtd", missing)
}

// DaemonPid is the live pid in /run/<name>.pid of a host daemon started
// as hack/setup-host.sh does (`/usr/sbin/NAME -d`), 0 if none.
func DaemonPid(name string) int {
	b, err := os.ReadFile("/run/" + name + ".pid")
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return 0
	}
	return pid
}
