//go:build integration

package integration

import (
	"fmt"
	"sort"
	"testing"
	"time"
)

const churnRounds = 20

// TestCtrChurn starts and kills a VM 20 times on one containerd and reports
// how long `ctr run -d` takes to reach RUNNING; nothing may accumulate.
func TestCtrChurn(t *testing.T) {
	s := requireKVM(t, "kernel")
	c := s.flavours[0]
	t.Run(c.Flavour.Name, func(t *testing.T) {
		c.watch(t)
		c.cleanupAfter(t)
		var toRunning []time.Duration
		for i := 1; i <= churnRounds; i++ {
			id := fmt.Sprintf("it-churn-%02d", i)
			start := time.Now()
			c.mustCtr(t, nsDefault, append([]string{"run", "-d"}, c.kvmRun(s.images["kernel"].ref, id)...)...)
			c.waitTaskStatus(t, nsDefault, id, "RUNNING", bootTimeout)
			running := time.Since(start)
			c.mustCtr(t, nsDefault, "task", "kill", "-s", "KILL", id)
			c.waitTaskStatus(t, nsDefault, id, "STOPPED", stopTimeout)
			c.deleteTask(t, nsDefault, id, 137)
			c.mustCtr(t, nsDefault, "containers", "delete", id)
			toRunning = append(toRunning, running)
			t.Logf("round %2d: run -d to RUNNING %v, whole round %v", i, running.Round(time.Millisecond),
				time.Since(start).Round(time.Millisecond))
		}
		sorted := append([]time.Duration(nil), toRunning...)
		sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
		median := (sorted[len(sorted)/2-1] + sorted[len(sorted)/2]) / 2
		t.Logf("ctr run -d to RUNNING over %d rounds: median %v, min %v, max %v", churnRounds,
			median.Round(time.Millisecond), sorted[0].Round(time.Millisecond), sorted[len(sorted)-1].Round(time.Millisecond))

		var ids []shimID
		for i := 1; i <= churnRounds; i++ {
			ids = append(ids, shimID{nsDefault, fmt.Sprintf("it-churn-%02d", i)})
		}
		assertNothingLeft(t, c, ids...)
	})
}
