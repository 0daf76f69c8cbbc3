// Package procfs reads /proc: it identifies processes across pid reuse (a
// pid together with its start time, field 22 of /proc/<pid>/stat, names
// one process) and unescapes mountinfo paths.
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

// UnescapeMountinfo undoes the octal escapes (\040 etc.) of a path in
// /proc/<pid>/mountinfo.
func UnescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
