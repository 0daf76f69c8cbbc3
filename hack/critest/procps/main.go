// Command procps stands in for the two process tools the CRI conformance
// suite runs in its busybox image that Debian's busybox-static lacks:
// `pgrep PATTERN` (the pids of processes whose name matches) and `ipcs -m`
// (the System V shared memory segments of the caller's IPC namespace). It
// is installed under both names and acts by the name it was run as.
package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

func main() {
	var code int
	switch name := filepath.Base(os.Args[0]); name {
	case "pgrep":
		code = pgrep(os.Args[1:])
	case "ipcs":
		code = ipcs(os.Args[1:])
	default:
		fmt.Fprintf(os.Stderr, "procps: run as pgrep or ipcs, not %q\n", name)
		code = 2
	}
	os.Exit(code)
}

// pgrep prints the pid of every process but itself whose name matches the
// one pattern argument; it exits 1 when none does, as procps' pgrep.
func pgrep(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: pgrep PATTERN")
		return 2
	}
	re, err := regexp.Compile(args[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgrep: %v\n", err)
		return 2
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgrep: %v\n", err)
		return 3
	}
	found := 1
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil {
			continue // gone meanwhile
		}
		if re.MatchString(strings.TrimSpace(string(comm))) {
			fmt.Println(pid)
			found = 0
		}
	}
	return found
}

// ipcs prints the shared memory segments (-m, the only mode) in the
// layout of util-linux's ipcs.
func ipcs(args []string) int {
	if len(args) != 1 || args[0] != "-m" {
		fmt.Fprintln(os.Stderr, "usage: ipcs -m")
		return 2
	}
	f, err := os.Open("/proc/sysvipc/shm")
	if err != nil {
		fmt.Fprintf(os.Stderr, "ipcs: %v\n", err)
		return 1
	}
	defer f.Close()
	fmt.Printf("\n------ Shared Memory Segments --------\n%-10s %-10s %-10s %-10s %-10s %-10s\n",
		"key", "shmid", "owner", "perms", "bytes", "nattch")
	sc := bufio.NewScanner(f)
	sc.Scan() // the header line
	for sc.Scan() {
		// key shmid perms size cpid lpid nattch uid gid ...
		fl := strings.Fields(sc.Text())
		if len(fl) < 8 {
			continue
		}
		key, _ := strconv.ParseInt(fl[0], 10, 64)
		perms, _ := strconv.ParseInt(fl[2], 10, 64)
		fmt.Printf("0x%08x %-10s %-10s %-10o %-10s %-10s\n", uint32(key), fl[1], fl[7], perms&0o777, fl[3], fl[6])
	}
	fmt.Println()
	return 0
}
