package main

import (
	"math"
	"strings"
	"testing"
)

// The last row of the events section puts the shims' own cost and
// libvirtd's per extra shim together for a node of the largest
// count's pods.
func TestBuildEvents(t *testing.T) {
	r := &results{Derived: map[string]any{}, Events: []eventsResult{
		{Flavour: "1.6", Shims: 1, Events: 4000, ShimUsPerEvent: 100, LibvirtdUsPerEvent: 1000},
		{Flavour: "1.6", Shims: 51, Events: 4000, ShimUsPerEvent: 110, LibvirtdUsPerEvent: 2000},
	}}
	r.buildEvents()
	perShim, ok := r.Derived["events_1.6_us_per_event_per_shim"].(float64)
	if !ok || math.Abs(perShim-130) > 1e-9 { // 110 + (2000-1000)/50
		t.Fatalf("per event per shim = %v, want 130", r.Derived["events_1.6_us_per_event_per_shim"])
	}
	last := r.Rows[len(r.Rows)-1]
	// 51 pods × 6 events / 60 s = 5.1 events/s, × 51 × 130 µs = 33.8 ms/s.
	if !strings.Contains(last.Value, "5.1 events/s") || !strings.Contains(last.Value, "33.8 ms CPU per second") || last.Status != "NOT MET" {
		t.Errorf("node row = %+v", last)
	}
}
