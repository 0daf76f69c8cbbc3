// Package critest holds the kvm handler to the runc handler under the CRI
// conformance suite (critest from cri-tools): it reads the suite's JUnit
// reports, counts each run, lists the specs that pass with runc and fail
// with kvm, and checks them against the exceptions file, where each such
// spec is listed with the reason it fails today. Its integration test
// (tag integration, run by `make critest`) starts the loopback registry
// and both containerds and runs the suite; see docs/critest.md.
package critest

import (
	"bufio"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// Result is the outcome of one spec in one run.
type Result int

// Spec outcomes.
const (
	Passed Result = iota
	Failed
	Skipped
)

// Specs maps a spec's full name to its outcome in one run.
type Specs map[string]Result

// Counts returns how many specs passed, failed and were skipped.
func (s Specs) Counts() (passed, failed, skipped int) {
	for _, r := range s {
		switch r {
		case Passed:
			passed++
		case Failed:
			failed++
		case Skipped:
			skipped++
		}
	}
	return passed, failed, skipped
}

type junitCase struct {
	Name    string    `xml:"name,attr"`
	Status  string    `xml:"status,attr"`
	Failure *struct{} `xml:"failure"`
	Error   *struct{} `xml:"error"`
	Skipped *struct{} `xml:"skipped"`
}

type junitSuites struct {
	Suites []struct {
		Cases []junitCase `xml:"testcase"`
	} `xml:"testsuite"`
}

// ParseJUnit reads a ginkgo JUnit report into the outcome of each spec.
// The suite's setup and teardown nodes ([BeforeSuite] and the like) are
// left out unless they failed: a failed setup fails the run.
func ParseJUnit(r io.Reader) (Specs, error) {
	var doc junitSuites
	if err := xml.NewDecoder(r).Decode(&doc); err != nil {
		return nil, fmt.Errorf("junit report: %w", err)
	}
	specs := Specs{}
	for _, s := range doc.Suites {
		for _, c := range s.Cases {
			res := caseResult(c)
			if !strings.HasPrefix(c.Name, "[It]") && res != Failed {
				continue
			}
			if _, dup := specs[c.Name]; dup {
				return nil, fmt.Errorf("junit report: spec %q twice", c.Name)
			}
			specs[c.Name] = res
		}
	}
	if len(specs) == 0 {
		return nil, fmt.Errorf("junit report: no specs")
	}
	return specs, nil
}

func caseResult(c junitCase) Result {
	switch c.Status {
	case "passed":
		return Passed
	case "skipped", "pending":
		return Skipped
	case "failed", "panicked", "interrupted", "aborted", "timedout":
		return Failed
	}
	switch {
	case c.Failure != nil || c.Error != nil:
		return Failed
	case c.Skipped != nil:
		return Skipped
	}
	return Passed
}

// Exceptions maps a spec that may pass with runc and fail with kvm to the
// reason it fails with kvm.
type Exceptions map[string]string

// ParseExceptions reads the exceptions file: "reason: <text>" lines open a
// group, and every other line up to the next reason names one spec of that
// group; blank lines and lines starting with # are ignored.
func ParseExceptions(r io.Reader) (Exceptions, error) {
	ex := Exceptions{}
	reason := ""
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "reason:"):
			reason = strings.TrimSpace(strings.TrimPrefix(line, "reason:"))
			if reason == "" {
				return nil, fmt.Errorf("exceptions line %d: empty reason", n)
			}
		case reason == "":
			return nil, fmt.Errorf("exceptions line %d: spec %q before any reason", n, line)
		default:
			if _, dup := ex[line]; dup {
				return nil, fmt.Errorf("exceptions line %d: spec %q listed twice", n, line)
			}
			ex[line] = reason
		}
	}
	return ex, sc.Err()
}

// readExceptionsFile reads the exceptions file at path.
func readExceptionsFile(path string) (Exceptions, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ex, err := ParseExceptions(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ex, nil
}

// Regressions lists, sorted, the specs that pass with runc and fail with
// kvm.
func Regressions(runc, kvm Specs) []string {
	var out []string
	for name, r := range runc {
		if r == Passed && kvm[name] == Failed {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// Gate is the verdict over every containerd's runs.
type Gate struct {
	// Unexcused pass with runc and fail with kvm on some containerd and
	// are not in the exceptions file: the gate fails.
	Unexcused []string
	// Stale are in the exceptions file but pass with kvm (or fail with
	// runc) on every containerd: the file must drop them, so the gate
	// fails on them too.
	Stale []string
}

// Check holds each containerd's regressions (as Regressions returns them)
// to the exceptions.
func Check(regressions map[string][]string, ex Exceptions) Gate {
	seen := map[string]bool{}
	var g Gate
	for _, names := range regressions {
		for _, n := range names {
			if seen[n] {
				continue
			}
			seen[n] = true
			if _, ok := ex[n]; !ok {
				g.Unexcused = append(g.Unexcused, n)
			}
		}
	}
	for n := range ex {
		if !seen[n] {
			g.Stale = append(g.Stale, n)
		}
	}
	sort.Strings(g.Unexcused)
	sort.Strings(g.Stale)
	return g
}

// OK reports whether the gate passes.
func (g Gate) OK() bool { return len(g.Unexcused) == 0 && len(g.Stale) == 0 }

// WriteExceptions writes an exceptions file listing specs under reason,
// for a first file made from a real run; each group is then split by the
// reason its specs really fail.
func WriteExceptions(w io.Writer, header, reason string, specs []string) error {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimSpace(header), "\n") {
		b.WriteString("# " + l + "\n")
	}
	b.WriteString("\nreason: " + reason + "\n")
	for _, s := range specs {
		b.WriteString(s + "\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}
