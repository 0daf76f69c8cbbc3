package main

import (
	"fmt"
	"io"
	"os"
	"time"
)

// The parts of one start, from the shim's own log lines: where the time
// goes before, inside, between and after the shim's Create and Start.
const (
	partToCreate  = "to_shim_create" // the client, containerd, the shim's process start
	partCreate    = "shim_create"    // the shim's Create as it logs it, with any wait for its libvirt connection
	partToStart   = "to_shim_start"  // Create's reply until the Start request
	partStart     = "shim_start"     // the shim's Start: libvirt's create, console, resume
	partToRunning = "to_running"     // Start's reply until the client saw RUNNING
)

// startPartNames are the parts in the order they happen.
var startPartNames = []string{partToCreate, partCreate, partToStart, partStart, partToRunning}

// logSize is where path ends now: the offset from which the next run's
// lines are read.
func logSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}

// startParts splits the start of the one VM a run created, from t0 until
// the client saw it RUNNING, into the parts named part*, using the lines
// the shim added to the log after offset. A run that did not log exactly
// one Create and one Start gets an error.
func startParts(logPath string, offset int64, t0, running time.Time) (map[string]time.Duration, error) {
	f, err := os.Open(logPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err = f.Seek(offset, io.SeekStart); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, err
	}
	ends := map[string]time.Time{}
	totals := map[string]time.Duration{}
	for _, m := range shimEndLine.FindAllStringSubmatch(string(b), -1) {
		if _, dup := ends[m[2]]; dup {
			return nil, fmt.Errorf("more than one %q VM line in one run", m[2])
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			return nil, fmt.Errorf("log time %q: %w", m[1], err)
		}
		total, ok := stepTimes(m[3])["total"]
		if !ok {
			return nil, fmt.Errorf("%q VM line without a total: %q", m[2], m[3])
		}
		ends[m[2]], totals[m[2]] = at, time.Duration(total*float64(time.Millisecond))
	}
	created, okC := ends["defined"]
	started, okS := ends["started"]
	if !okC || !okS {
		return nil, fmt.Errorf("the run logged no %q and %q VM lines", "defined", "started")
	}
	createBegin := created.Add(-totals["defined"])
	startBegin := started.Add(-totals["started"])
	return map[string]time.Duration{
		partToCreate:  createBegin.Sub(t0),
		partCreate:    totals["defined"],
		partToStart:   startBegin.Sub(created),
		partStart:     totals["started"],
		partToRunning: running.Sub(started),
	}, nil
}

// addStartParts records the parts of one run's start in p, or says why
// they are missing; the run itself stands either way.
func addStartParts(p *pathResult, logPath string, offset int64, t0, running time.Time) {
	parts, err := startParts(logPath, offset, t0, running)
	if err != nil {
		logf("latency: %s: no split of the start time: %v", p.Key, err)
		return
	}
	if p.PartsMs == nil {
		p.PartsMs = map[string][]float64{}
	}
	for _, name := range startPartNames {
		p.PartsMs[name] = append(p.PartsMs[name], ms(parts[name]))
	}
}
