package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// SweepDeadRuns removes what runs of a test tier that died (killed with
// their session, or by a time limit) left on this host: every one of the
// tier's directories is named prefix + something, and the caller holds
// the tier's host lock, so no live run owns any of them. Left alone, the
// dead run's shims and VMs go on using the CPU, and its VMs' names share
// the tier's pod namespace, so they read as the new run's leftovers.
//
// It destroys and undefines the libvirt domains whose XML names a path
// below such a directory, kills the processes whose arguments name one
// (containerd, shims, virtiofsd, a wrapper not yet exec'd), unmounts what
// is mounted below them and removes them. It returns what it removed.
func SweepDeadRuns(prefix string) []string {
	dirs, _ := filepath.Glob(prefix + "*")
	if len(dirs) == 0 {
		return nil
	}
	var swept []string
	if l, err := ConnectLibvirt(); err != nil {
		swept = append(swept, err.Error())
	} else {
		for _, dir := range dirs {
			doms, err := RemoveDomainsMentioning(l, dir)
			swept = append(swept, doms...)
			if err != nil {
				swept = append(swept, err.Error())
			}
		}
		_ = l.Disconnect()
	}
	procs := ProcessesMatching(func(args []string) bool {
		for _, a := range args {
			if strings.Contains(a, prefix) {
				return true
			}
		}
		return false
	})
	for _, p := range procs {
		if p.Pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(p.Pid, syscall.SIGKILL); err == nil {
			swept = append(swept, fmt.Sprintf("process %d: %.160s", p.Pid, p.Cmdline))
		}
	}
	// A killed process's mounts (its own mount namespace's) go with it;
	// give the kernel a moment before unmounting what the host still has.
	if len(procs) > 0 {
		time.Sleep(500 * time.Millisecond)
	}
	for _, dir := range dirs {
		if err := RemoveTree(dir); err != nil {
			swept = append(swept, fmt.Sprintf("%s kept: %v", dir, err))
			continue
		}
		swept = append(swept, "directory "+dir)
	}
	return swept
}
