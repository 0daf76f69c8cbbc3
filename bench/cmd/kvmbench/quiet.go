package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// disturbance is what else ran on the host while the benchmark did: other
// users' QEMU processes and the load average, sampled every second.
type disturbance struct {
	Samples          int     `json:"samples"`
	SamplesWithOther int     `json:"samples_with_other_qemu"`
	MaxOtherQEMU     int     `json:"max_other_qemu"`
	MaxLoad1         float64 `json:"max_load1"`
}

// otherQEMU counts QEMU processes whose command line does not mention
// mine (the benchmark's work dir: every VM it starts has its files there).
func otherQEMU(mine string) int {
	entries, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		target, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err != nil || filepath.Base(target) != "qemu-system-x86_64" {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if mine == "" || !strings.Contains(string(cmdline), mine) {
			n++
		}
	}
	return n
}

func load1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// monitor samples the host until stop is called and returns what it saw.
func monitor(mine string) (stop func() disturbance) {
	var mu sync.Mutex
	var d disturbance
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			n, l := otherQEMU(mine), load1()
			mu.Lock()
			d.Samples++
			if n > 0 {
				d.SamplesWithOther++
			}
			d.MaxOtherQEMU = max(d.MaxOtherQEMU, n)
			d.MaxLoad1 = max(d.MaxLoad1, l)
			mu.Unlock()
		}
	}()
	return func() disturbance {
		close(done)
		mu.Lock()
		defer mu.Unlock()
		return d
	}
}

// waitQuiet waits, at most limit, until no other QEMU process has run
// and the 1-minute load stayed below 1 for a whole quiet period.
func waitQuiet(ctx context.Context, limit, quiet time.Duration) error {
	deadline := time.Now().Add(limit)
	var since time.Time
	for {
		if otherQEMU("") == 0 && load1() < 1 {
			if since.IsZero() {
				since = time.Now()
			}
			if time.Since(since) >= quiet {
				return nil
			}
		} else {
			since = time.Time{}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the host did not go quiet within %v (other QEMU processes: %d, load %.2f)", limit, otherQEMU(""), load1())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
