// Command testreport prints `go test -json` as the plain text `go test -v`
// would, as it comes, and ends with the failures: each failing test's own
// messages, so that whoever reads only the end of a long run (a CI log's
// tail) still sees why it failed.
//
// A failing test's messages are its output lines of the form
// "<file>.go:<line>: ...", each with the first lines that continue it
// (a list of what was left behind), cut to size; the rest of a long block
// (a daemon's log printed for context) stays in the streamed output above
// the summary.
//
// It exits 1 if a test or a package failed, or if the stream ended without
// a package result (go test died or did not build), 0 otherwise.
//
// Example:
//
//	go test -json -tags integration ./integration/ | go run ./hack/testreport
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
)

const (
	// messagesPerTest is how many of a failing test's last messages the
	// summary shows.
	messagesPerTest = 12
	// messageWidth cuts a message line in the summary.
	messageWidth = 400
	// continuationLines is how many lines continuing a message the summary
	// shows.
	continuationLines = 8
)

// event is the part of test2json's TestEvent this command reads.
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// message is a line a test printed with t.Log, t.Error or t.Fatal:
// indented, then "<file>.go:<line>: ".
var message = regexp.MustCompile(`^\s+[\w.-]+\.go:\d+: `)

// test is what the report keeps of one test.
type test struct {
	pkg, name string
	messages  [][]string // its last messagesPerTest messages, each with its continuation lines
	more      []int      // per message, the continuation lines left out
	failed    bool
	elapsed   float64
}

type report struct {
	tests    map[string]*test
	order    []*test // in the order they started
	pkgFail  []string
	pkgsDone int
	// pkgOut is each package's last lines printed outside any test
	// (TestMain, a timeout's panic and its list of running tests).
	pkgOut map[string][]string
}

func main() {
	r := newReport()
	if err := r.read(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(2)
	}
	if !r.summary(os.Stdout) {
		os.Exit(1)
	}
}

func newReport() *report {
	return &report{tests: map[string]*test{}, pkgOut: map[string][]string{}}
}

// read streams the events' output to w and keeps what the summary needs.
// Lines that are not JSON (go vet's or the compiler's complaints) are
// copied as they are.
func (r *report) read(in io.Reader, w io.Writer) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintf(w, "%s\n", line)
			continue
		}
		r.add(e, w)
	}
	return sc.Err()
}

func (r *report) add(e event, w io.Writer) {
	if e.Action == "output" || e.Action == "build-output" {
		_, _ = io.WriteString(w, e.Output)
	}
	if e.Test == "" {
		switch e.Action {
		case "output":
			if line := strings.TrimRight(e.Output, "\n"); line != "" {
				l := append(r.pkgOut[e.Package], cut(line, messageWidth))
				if len(l) > messagesPerTest {
					l = l[1:]
				}
				r.pkgOut[e.Package] = l
			}
		case "pass", "skip":
			r.pkgsDone++
		case "fail":
			r.pkgsDone++
			r.pkgFail = append(r.pkgFail, e.Package)
		}
		return
	}
	key := e.Package + "\x00" + e.Test
	t := r.tests[key]
	if t == nil {
		t = &test{pkg: e.Package, name: e.Test}
		r.tests[key] = t
		r.order = append(r.order, t)
	}
	switch e.Action {
	case "output":
		line := strings.TrimRight(e.Output, "\n")
		switch n := len(t.messages); {
		case message.MatchString(line):
			t.messages = append(t.messages, []string{cut(strings.TrimSpace(line), messageWidth)})
			t.more = append(t.more, 0)
			if n+1 > messagesPerTest {
				t.messages, t.more = t.messages[1:], t.more[1:]
			}
		case n > 0 && strings.HasPrefix(line, "    ") && !marker(line):
			if len(t.messages[n-1]) <= continuationLines {
				t.messages[n-1] = append(t.messages[n-1], cut(strings.TrimSpace(line), messageWidth))
			} else {
				t.more[n-1]++
			}
		}
	case "fail":
		t.failed, t.elapsed = true, e.Elapsed
	}
}

// summary prints the failures and tells whether the run passed.
func (r *report) summary(w io.Writer) bool {
	var failed []*test
	for _, t := range r.order {
		if t.failed && !r.hasFailedSubtest(t) {
			failed = append(failed, t)
		}
	}
	if len(failed) == 0 && len(r.pkgFail) == 0 && r.pkgsDone > 0 {
		return true
	}
	fmt.Fprintf(w, "\n==== testreport: %d failing test(s), failed package(s): %s\n", len(failed), orNone(r.pkgFail))
	if r.pkgsDone == 0 {
		fmt.Fprintln(w, "no package reported a result: go test did not build or did not finish")
	}
	for _, t := range failed {
		fmt.Fprintf(w, "--- FAIL: %s (%.1fs)\n", t.name, t.elapsed)
		for i, m := range t.messages {
			fmt.Fprintf(w, "    %s\n", m[0])
			for _, c := range m[1:] {
				fmt.Fprintf(w, "        %s\n", c)
			}
			if t.more[i] > 0 {
				fmt.Fprintf(w, "        (%d more lines, in the output above)\n", t.more[i])
			}
		}
	}
	for _, p := range r.pkgFail {
		fmt.Fprintf(w, "--- package %s, its last lines outside a test:\n", p)
		for _, l := range r.pkgOut[p] {
			fmt.Fprintf(w, "    %s\n", l)
		}
	}
	return false
}

// hasFailedSubtest tells whether a subtest of t failed: the summary shows
// the most specific failures, not every parent again.
func (r *report) hasFailedSubtest(t *test) bool {
	for _, s := range r.order {
		if s.failed && s.pkg == t.pkg && strings.HasPrefix(s.name, t.name+"/") {
			return true
		}
	}
	return false
}

// marker tells go test's own lines ("=== RUN", "--- FAIL: ...") from a
// test's.
func marker(line string) bool {
	l := strings.TrimSpace(line)
	return strings.HasPrefix(l, "=== ") || strings.HasPrefix(l, "--- ")
}

func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}
