package vm

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// shortNameMax is how much of a domain's name libvirt puts in its short
// name (VIR_DOMAIN_SHORT_NAME_MAX).
const shortNameMax = 20

// virtiofsdPidPrefix is how the names of the pid files libvirt writes
// (in QEMUPidDir) for the virtiofsd daemons of the running domain with id
// and name begin: "<short name>-<fs alias>-fs.pid", the short name being
// "<id>-<name, cut at 20>".
func virtiofsdPidPrefix(id int32, name string) string {
	short := name
	if len(short) > shortNameMax {
		short = short[:shortNameMax]
	}
	return fmt.Sprintf("%d-%s-", id, short)
}

// VirtiofsdPIDs lists the virtiofsd daemons libvirt runs for the running
// domain name, each from its pid file, and all their processes: the
// daemons and their children (virtiofsd's sandbox is a forked child). A
// domain without shares has none. Each pid is checked to be a virtiofsd.
func (c *Conn) VirtiofsdPIDs(name string) (daemons, all []int, err error) {
	_, d, err := c.lookup(name)
	if err != nil {
		return nil, nil, err
	}
	return virtiofsdPIDs(QEMUPidDir, virtiofsdPidPrefix(d.ID, name), "/proc")
}

func virtiofsdPIDs(dir, prefix, proc string) (daemons, all []int, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, err
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), prefix) || !strings.HasSuffix(e.Name(), "-fs.pid") {
			continue
		}
		f := filepath.Join(dir, e.Name())
		b, readFileErr := os.ReadFile(f)
		if readFileErr != nil {
			return nil, nil, fmt.Errorf("virtiofsd pid file: %w", readFileErr)
		}
		pid, atoiErr := strconv.Atoi(strings.TrimSpace(string(b)))
		if atoiErr != nil || pid <= 1 {
			return nil, nil, fmt.Errorf("virtiofsd pid file %s holds %q", f, b)
		}
		if !isVirtiofsd(proc, pid) {
			return nil, nil, fmt.Errorf("pid %d of %s is not a virtiofsd", pid, f)
		}
		daemons = append(daemons, pid)
	}
	if len(daemons) == 0 {
		return nil, nil, nil
	}
	children, err := childrenOf(proc, daemons)
	if err != nil {
		return nil, nil, err
	}
	return daemons, append(slices.Clone(daemons), children...), nil
}

// isVirtiofsd reports whether pid runs a virtiofsd binary.
func isVirtiofsd(proc string, pid int) bool {
	exe, err := os.Readlink(filepath.Join(proc, strconv.Itoa(pid), "exe"))
	return err == nil && strings.Contains(filepath.Base(exe), "virtiofsd")
}

// childrenOf lists the virtiofsd processes whose parent is one of parents.
func childrenOf(proc string, parents []int) ([]int, error) {
	entries, err := os.ReadDir(proc)
	if err != nil {
		return nil, err
	}
	isParent := map[int]bool{}
	for _, p := range parents {
		isParent[p] = true
	}
	var kids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(proc, e.Name(), "status"))
		if err != nil {
			continue // gone meanwhile
		}
		if isParent[ppid(string(b))] && isVirtiofsd(proc, pid) {
			kids = append(kids, pid)
		}
	}
	return kids, nil
}

// ppid reads the PPid line of /proc/<pid>/status.
func ppid(status string) int {
	for _, l := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(l, "PPid:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}
