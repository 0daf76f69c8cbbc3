package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

func stream(t *testing.T, events ...event) string {
	t.Helper()
	var b strings.Builder
	for _, e := range events {
		j, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(j)
		b.WriteByte('\n')
	}
	return b.String()
}

func out(test, s string) event {
	return event{Action: "output", Package: "p", Test: test, Output: s}
}

func run(t *testing.T, in string) (string, bool) {
	t.Helper()
	r := newReport()
	var w bytes.Buffer
	if err := r.read(strings.NewReader(in), &w); err != nil {
		t.Fatal(err)
	}
	ok := r.summary(&w)
	return w.String(), ok
}

func TestReportStreamsAndSummarizesLeafFailures(t *testing.T) {
	in := stream(t,
		out("TestA", "=== RUN   TestA\n"),
		out("TestA", "=== RUN   TestA/1.6\n"),
		out("TestA/1.6", "    a_test.go:10: booted\n"),
		out("TestA/1.6", "    a_test.go:12: left behind after delete:\n"),
		out("TestA/1.6", "          pod IP still reserved: /x/10.0.0.5\n"),
		out("TestA/1.6", "    c_test.go:89: containerd 1.6 log during this test (tail):\n"),
		out("TestA/1.6", "        time=\"...\" level=info msg=\"x.go:1: shown as the dump's first line\"\n"),
		out("TestA/1.6", "    --- FAIL: TestA/1.6 (15.20s)\n"),
		event{Action: "fail", Package: "p", Test: "TestA/1.6", Elapsed: 15.2},
		event{Action: "fail", Package: "p", Test: "TestA", Elapsed: 15.3},
		out("TestB", "    b_test.go:3: fine\n"),
		event{Action: "pass", Package: "p", Test: "TestB"},
		event{Action: "output", Package: "p", Output: "panic: test timed out after 80m0s\n"},
		event{Action: "output", Package: "p", Output: "FAIL\tp\t16.000s\n"},
		event{Action: "fail", Package: "p"},
	)
	got, ok := run(t, in)
	if ok {
		t.Error("a failed run reported success")
	}
	for _, want := range []string{
		"=== RUN   TestA/1.6\n", // streamed as it came
		"          pod IP still reserved: /x/10.0.0.5\n",
		"==== testreport: 1 failing test(s), failed package(s): p\n",
		"--- FAIL: TestA/1.6 (15.2s)\n    a_test.go:10: booted\n    a_test.go:12: left behind after delete:\n        pod IP still reserved: " +
			"/x/10.0.0.5\n    c_test.go:89:",
		"--- package p, its last lines outside a test:\n    panic: test timed out after 80m0s\n    FAIL\tp\t16.000s\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "--- FAIL: TestA (") {
		t.Errorf("the parent of a failed subtest is summarized again:\n%s", got)
	}
	summary := got[strings.Index(got, "==== testreport"):]
	if strings.Contains(summary, "b_test.go") || strings.Contains(summary, "(15.20s)") {
		t.Errorf("the summary holds lines that are not the failing test's messages:\n%s", summary)
	}
}

func TestReportKeepsLastMessages(t *testing.T) {
	var events []event
	for i := range messagesPerTest + 5 {
		events = append(events, out("TestA", fmt.Sprintf("    a_test.go:%d: %s\n", i, strings.Repeat("x", messageWidth+10))))
	}
	events = append(events, event{Action: "fail", Package: "p", Test: "TestA"}, event{Action: "fail", Package: "p"})
	got, _ := run(t, stream(t, events...))
	summary := got[strings.Index(got, "==== testreport"):]
	if strings.Contains(summary, "a_test.go:4: ") || !strings.Contains(summary, "a_test.go:5: ") ||
		!strings.Contains(summary, fmt.Sprintf("a_test.go:%d: ", messagesPerTest+4)) {
		t.Errorf("want the last %d messages:\n%s", messagesPerTest, summary)
	}
	if !strings.Contains(summary, strings.Repeat("x", messageWidth-20)+"...") {
		t.Errorf("long messages are not cut:\n%s", summary)
	}
}

func TestReportPassAndNoResult(t *testing.T) {
	got, ok := run(t,
		stream(t, out("TestA", "    a_test.go:1: hi\n"), event{Action: "pass", Package: "p", Test: "TestA"}, event{Action: "pass", Package: "p"}))
	if !ok || strings.Contains(got, "testreport") {
		t.Errorf("a passing run: ok=%v\n%s", ok, got)
	}
	// go test killed, or a build error printed as plain text: no package result.
	got, ok = run(t, "# p\n./a.go:1:1: syntax error\n")
	if ok || !strings.Contains(got, "./a.go:1:1: syntax error\n") || !strings.Contains(got, "did not build or did not finish") {
		t.Errorf("no package result: ok=%v\n%s", ok, got)
	}
}

func TestReportCutsLongContinuations(t *testing.T) {
	events := []event{out("TestA", "    a_test.go:1: containerd log (tail):\n")}
	for i := range continuationLines + 3 {
		events = append(events, out("TestA", fmt.Sprintf("        line %d\n", i)))
	}
	events = append(events, out("TestA", "    a_test.go:2: after\n"), event{Action: "fail", Package: "p", Test: "TestA"},
		event{Action: "fail", Package: "p"})
	got, _ := run(t, stream(t, events...))
	summary := got[strings.Index(got, "==== testreport"):]
	want := fmt.Sprintf("        line %d\n        (3 more lines, in the output above)\n    a_test.go:2: after\n", continuationLines-1)
	if !strings.Contains(summary, want) || strings.Contains(summary, fmt.Sprintf("line %d\n", continuationLines)) {
		t.Errorf("want %d continuation lines, then a count:\n%s", continuationLines, summary)
	}
}
