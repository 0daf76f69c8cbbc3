//go:build faultinject

package shim

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"
)

// This build (go build -tags faultinject, made by the integration suite
// for its fault tests only) lets a test stop the shim at a named step so
// that it can kill a component while a call is in flight, deterministically:
// while <state dir>/hold-<step> exists the shim waits at the step, and it
// shows that it does by <state dir>/held-<step> (holding its pid).

// Read by code built either way (today only faultpoint_test.go, which this
// build leaves out), hence the nolint.
const faultInjection = true //nolint:unused // see above

// faultDir is the shim's state dir once known; guarded by being atomic.
var faultDir atomic.Pointer[string]

// holdPoll is how often a held step looks for its hold file to go.
const holdPoll = 20 * time.Millisecond

func setFaultDir(dir string) { faultDir.Store(&dir) }

func faultPoint(step string) {
	dir := faultDir.Load()
	if dir == nil || *dir == "" {
		return
	}
	hold := filepath.Join(*dir, "hold-"+step)
	if !exists(hold) {
		return
	}
	held := filepath.Join(*dir, "held-"+step)
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
