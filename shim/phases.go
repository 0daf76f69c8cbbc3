package shim

import (
	"fmt"
	"strings"
	"time"
)

// phases times the steps of a Create or Start for the log line that ends
// it, so that where the start-up time goes can be read from any node's
// containerd log.
type phases struct {
	last  time.Time
	start time.Time
	steps []string
}

func newPhases() *phases {
	now := time.Now()
	return &phases{last: now, start: now}
}

// mark ends the step called name. It only times: the points where a fault
// test can hold the shim are called out on their own (faultpoint.Hold).
func (p *phases) mark(name string) {
	now := time.Now()
	p.steps = append(p.steps, formatStep(name, now.Sub(p.last)))
	p.last = now
}

// String lists the steps and the total, e.g. "mount=0.4ms define=2.9ms total=3.3ms".
func (p *phases) String() string {
	return strings.Join(append(p.steps, formatStep("total", p.last.Sub(p.start))), " ")
}

// formatStep renders one step as "name=1.2ms".
func formatStep(name string, d time.Duration) string {
	return fmt.Sprintf("%s=%.1fms", name, float64(d.Microseconds())/1000)
}
