//go:build integration

package critest

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// verdict prints each run's counts, each containerd's specs that pass with
// runc and fail with kvm, and the wall time, into the test log and
// summary.txt; then holds the regressions to the exceptions file (or,
// with KVM_CRITEST_WRITE_EXCEPTIONS, writes them as a new one).
func (h *harness) verdict(t *testing.T, runs []run, wall time.Duration) {
	var b strings.Builder
	fmt.Fprintf(&b, "CRI conformance (critest) in %v\n", wall.Round(time.Second))
	fmt.Fprintf(&b, "%-10s %-7s %6s %6s %7s %8s %9s\n", "containerd", "handler", "passed", "failed", "skipped", "wall", "pods left")
	byKey := map[string]Specs{}
	for _, r := range runs {
		p, f, s := r.specs.Counts()
		fmt.Fprintf(&b, "%-10s %-7s %6d %6d %7d %8v %9d\n", r.flavour, r.handler, p, f, s, r.wall.Round(time.Second), r.leftPods)
		byKey[r.flavour+"/"+r.handler] = r.specs
	}
	regressions := map[string][]string{}
	for _, name := range h.flavours {
		regs := Regressions(byKey[name+"/runc"], byKey[name+"/kvm"])
		regressions[name] = regs
		fmt.Fprintf(&b, "\ncontainerd %s: %d specs pass with runc and fail with kvm\n", name, len(regs))
		for _, s := range regs {
			fmt.Fprintf(&b, "  %s\n", s)
		}
	}
	if h.writeExc != "" {
		h.writeExceptions(t, regressions)
	}
	ex, err := readExceptionsFile(h.exception)
	if err != nil {
		t.Fatal(err)
	}
	g := Check(regressions, ex)
	fmt.Fprintf(&b, "\nexceptions: %d listed; %d regressions not listed; %d listed that no longer fail\n",
		len(ex), len(g.Unexcused), len(g.Stale))
	t.Log("\n" + b.String())
	if err := os.WriteFile(filepath.Join(h.out, "summary.txt"), []byte(b.String()), 0o644); err != nil {
		t.Error(err)
	}
	for _, s := range g.Unexcused {
		t.Errorf("passes with runc, fails with kvm, not in %s: %s", h.exception, s)
	}
	for _, s := range g.Stale {
		t.Errorf("listed in %s but no longer fails with kvm where it passes with runc (remove it): %s", h.exception, s)
	}
}

// writeExceptions writes every containerd's regressions, once each, as a
// new exceptions file under one reason, to be split by hand by the reason
// each really fails.
func (h *harness) writeExceptions(t *testing.T, regressions map[string][]string) {
	seen := map[string]bool{}
	var all []string
	for _, regs := range regressions {
		for _, s := range regs {
			if !seen[s] {
				seen[s] = true
				all = append(all, s)
			}
		}
	}
	sort.Strings(all)
	f, err := os.Create(h.writeExc)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	header := "Specs that pass with the runc handler and fail with the kvm handler\n" +
		"(written by make critest from a real run; docs/critest.md says why each fails)."
	if err := WriteExceptions(f, header, "untriaged", all); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %d specs to %s", len(all), h.writeExc)
}
