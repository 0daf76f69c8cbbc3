package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// readyLine is what the test guest's /init prints once userspace is up.
const readyLine = "KVM-GUEST-READY"

// consolePoll is how often the console log is read: the resolution of the
// boot times.
const consolePoll = 10 * time.Millisecond

// bootTimes are measured from the same start as the path's start latency.
type bootTimes struct {
	FirstLine time.Duration // the guest's first complete line on the console
	Ready     time.Duration // the guest's userspace printed readyLine
}

// watchConsole polls the console log that virtlogd writes for a VM (found
// by locate, which returns "" until the VM exists) and reports when its
// first non-blank line and the ready line appeared, relative to t0. Both
// the shim and the go-libvirt baseline are timed from that same file, so
// the mechanism costs them alike.
func watchConsole(ctx context.Context, t0 time.Time, locate func() string) (bootTimes, error) {
	var bt bootTimes
	path := ""
	for {
		if path == "" {
			path = locate()
		}
		if path != "" {
			b, err := os.ReadFile(path)
			now := time.Since(t0)
			if err == nil {
				if bt.FirstLine == 0 && hasLine(b) {
					bt.FirstLine = now
				}
				if bytes.Contains(b, []byte(readyLine)) {
					if bt.FirstLine == 0 {
						bt.FirstLine = now
					}
					bt.Ready = now
					return bt, nil
				}
			}
		}
		select {
		case <-ctx.Done():
			where := path
			if where == "" {
				where = "(no console log yet)"
			}
			return bt, fmt.Errorf("no %s on the console %s: %w", readyLine, where, ctx.Err())
		case <-time.After(consolePoll):
		}
	}
}

// hasLine reports whether b holds a complete line with something printable.
func hasLine(b []byte) bool {
	for {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			return false
		}
		if len(bytes.TrimSpace(b[:i])) > 0 {
			return true
		}
		b = b[i+1:]
	}
}

// shimConsole finds the console log of the only VM in a shim state dir.
func shimConsole(stateDir string) func() string {
	return func() string {
		m, _ := filepath.Glob(filepath.Join(stateDir, "vms", "*", "console.log"))
		if len(m) == 1 {
			return m[0]
		}
		return ""
	}
}
