package critest

import (
	"reflect"
	"strings"
	"testing"
)

// A ginkgo v2 JUnit report in the shape critest writes: setup nodes,
// passed, failed and skipped specs.
const report = `<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="4" disabled="0" errors="0" failures="1" time="12.5">
  <testsuite name="CRI validation" package="/x" tests="4" skipped="1" failures="1" errors="0" time="12.5">
    <testcase name="[BeforeSuite]" classname="CRI validation" status="passed" time="0.1"></testcase>
    <testcase name="[It] [sig-node] Container runtime should support exec [Conformance]" classname="CRI validation" status="passed"
      time="3"></testcase>
    <testcase name="[It] [sig-node] Container runtime should support logs" classname="CRI validation" status="failed" time="5">
      <failure message="boom" type="failed">boom</failure>
    </testcase>
    <testcase name="[It] [sig-node] AppArmor should work" classname="CRI validation" status="skipped" time="0">
      <skipped message="skipped"></skipped>
    </testcase>
    <testcase name="[AfterSuite]" classname="CRI validation" status="failed" time="0"><failure message="x"/></testcase>
  </testsuite>
</testsuites>`

func TestParseJUnit(t *testing.T) {
	specs, err := ParseJUnit(strings.NewReader(report))
	if err != nil {
		t.Fatal(err)
	}
	want := Specs{
		"[It] [sig-node] Container runtime should support exec [Conformance]": Passed,
		"[It] [sig-node] Container runtime should support logs":               Failed,
		"[It] [sig-node] AppArmor should work":                                Skipped,
		"[AfterSuite]":                                                        Failed,
	}
	if !reflect.DeepEqual(specs, want) {
		t.Errorf("specs = %v\nwant %v", specs, want)
	}
	if p, f, s := specs.Counts(); p != 1 || f != 2 || s != 1 {
		t.Errorf("counts = %d %d %d; want 1 2 1", p, f, s)
	}
	// Without a status attribute (older reports) the child elements decide.
	old := `<testsuites><testsuite><testcase name="[It] a"><failure/></testcase>` +
		`<testcase name="[It] b"><skipped/></testcase><testcase name="[It] c"/></testsuite></testsuites>`
	specs, err = ParseJUnit(strings.NewReader(old))
	if err != nil || !reflect.DeepEqual(specs, Specs{"[It] a": Failed, "[It] b": Skipped, "[It] c": Passed}) {
		t.Errorf("old report = %v, %v", specs, err)
	}
	twice := `<testsuites><testsuite><testcase name="[It] a"/><testcase name="[It] a"/></testsuite></testsuites>`
	for _, bad := range []string{"", "<testsuites></testsuites>", twice} {
		if _, err := ParseJUnit(strings.NewReader(bad)); err == nil {
			t.Errorf("ParseJUnit(%q) did not fail", bad)
		}
	}
}

func TestParseExceptions(t *testing.T) {
	ex, err := ParseExceptions(strings.NewReader("# header\n\nreason: no plain containers\n[It] a\n[It] b\nreason: other\n  [It] c  \n"))
	if err != nil {
		t.Fatal(err)
	}
	want := Exceptions{"[It] a": "no plain containers", "[It] b": "no plain containers", "[It] c": "other"}
	if !reflect.DeepEqual(ex, want) {
		t.Errorf("exceptions = %v; want %v", ex, want)
	}
	for _, bad := range []string{"[It] a\n", "reason:\n[It] a\n", "reason: r\n[It] a\n[It] a\n"} {
		if _, err := ParseExceptions(strings.NewReader(bad)); err == nil {
			t.Errorf("ParseExceptions(%q) did not fail", bad)
		}
	}
}

func TestGate(t *testing.T) {
	runc := Specs{"a": Passed, "b": Passed, "c": Passed, "d": Failed, "e": Skipped}
	kvm := Specs{"a": Passed, "b": Failed, "c": Failed, "d": Failed, "e": Failed}
	if got := Regressions(runc, kvm); !reflect.DeepEqual(got, []string{"b", "c"}) {
		t.Fatalf("regressions = %v; want [b c]", got)
	}
	regs := map[string][]string{"1.6": {"b", "c"}, "2.x": {"c"}}
	g := Check(regs, Exceptions{"b": "r", "c": "r"})
	if !g.OK() {
		t.Errorf("every regression excused: gate = %+v", g)
	}
	g = Check(regs, Exceptions{"c": "r", "z": "r"})
	if g.OK() || !reflect.DeepEqual(g.Unexcused, []string{"b"}) || !reflect.DeepEqual(g.Stale, []string{"z"}) {
		t.Errorf("gate = %+v; want unexcused [b], stale [z]", g)
	}
}

func TestWriteExceptionsRoundTrip(t *testing.T) {
	var b strings.Builder
	if err := WriteExceptions(&b, "line one\nline two", "untriaged", []string{"[It] x", "[It] y"}); err != nil {
		t.Fatal(err)
	}
	ex, err := ParseExceptions(strings.NewReader(b.String()))
	if err != nil || !reflect.DeepEqual(ex, Exceptions{"[It] x": "untriaged", "[It] y": "untriaged"}) {
		t.Errorf("round trip = %v, %v\n%s", ex, err, b.String())
	}
}

// TestExceptionsFile: the file make critest reads parses, and names specs
// as the JUnit reports do ("[It] ..."), each under a reason.
func TestExceptionsFile(t *testing.T) {
	ex, err := readExceptionsFile("exceptions.txt")
	if err != nil {
		t.Fatal(err)
	}
	for spec, reason := range ex {
		if !strings.HasPrefix(spec, "[It] ") || reason == "" {
			t.Errorf("exceptions.txt: %q (reason %q): not a spec name as JUnit reports give it", spec, reason)
		}
	}
}
