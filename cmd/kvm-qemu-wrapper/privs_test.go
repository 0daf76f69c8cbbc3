package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The wrapper's privilege drop, run in a child (it cannot be undone):
// the child's status shows no_new_privs and no capabilities it may pass
// on, and as a non-root user none at all.
func TestDropPrivileges(t *testing.T) {
	if os.Getenv("WRAPPER_DROP_CHILD") == "1" {
		if err := dropPrivileges(); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile("/proc/self/status")
		if err != nil {
			t.Fatal(err)
		}
		os.Stdout.Write(b)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestDropPrivileges$")
	cmd.Env = append(os.Environ(), "WRAPPER_DROP_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	want := map[string]string{"NoNewPrivs": "1", "CapInh": "0000000000000000", "CapAmb": "0000000000000000"}
	if os.Geteuid() != 0 {
		want["CapPrm"], want["CapEff"] = "0000000000000000", "0000000000000000"
	}
	for _, l := range strings.Split(string(out), "\n") {
		k, v, _ := strings.Cut(l, ":")
		if w, ok := want[k]; ok {
			if strings.TrimSpace(v) != w {
				t.Errorf("%s = %s after the drop, want %s", k, strings.TrimSpace(v), w)
			}
			delete(want, k)
		}
	}
	if len(want) > 0 {
		t.Errorf("status lacks %v:\n%s", want, out)
	}
}
