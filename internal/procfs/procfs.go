// Package procfs identifies processes across pid reuse: a pid together
// with its start time (field 22 of /proc/<pid>/stat) names one process.
package procfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// StartTime returns the start time of process pid, in clock ticks since
// boot.
func StartTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces and parentheses; the
	// fields after the last ')' are fixed.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 20 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

// Gone reports whether the process pid that started at start has exited
// (its pid is free or was reused). An unreadable /proc entry for other
// reasons counts as alive: better to keep a record than to drop a live one.
func Gone(pid int, start uint64) bool {
	got, err := StartTime(pid)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ESRCH) {
		return true
	}
	return err == nil && got != start
}
