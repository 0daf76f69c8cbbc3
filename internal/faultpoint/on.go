//go:build faultinject

package faultpoint

import (
	"errors"
	"io/fs"
	"os"
	"strconv"
	"sync/atomic"
	"time"
)

// Enabled tells whether this build can hold a task call: this one, made by
// the integration suite for its fault tests only, can.
const Enabled = true

// dir is the shim's state dir once known; guarded by being atomic.
var dir atomic.Pointer[string]

// holdPoll is how often a held point looks for its hold file to go.
const holdPoll = 20 * time.Millisecond

// SetDir names the directory of the hold files (the shim's state dir).
func SetDir(d string) { dir.Store(&d) }

// Hold waits at p while its hold file exists, with the held file showing it.
func Hold(p Point) {
	d := dir.Load()
	if d == nil || *d == "" {
		return
	}
	hold := HoldFile(*d, p)
	if !exists(hold) {
		return
	}
	held := HeldFile(*d, p)
	_ = os.WriteFile(held, []byte(strconv.Itoa(os.Getpid())), 0o600)
	defer os.Remove(held)
	for exists(hold) {
		time.Sleep(holdPoll)
	}
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return !errors.Is(err, fs.ErrNotExist)
}
