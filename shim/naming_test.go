package shim

import (
	"strings"
	"testing"
)

func TestPathSegment(t *testing.T) {
	for _, s := range []string{"..", ".", "a/b", "", "-x", strings.Repeat("a", 200), "x\x00"} {
		if got := pathSegment(s); strings.ContainsAny(got, "/\x00") || got == ".." || got == "." || got == "" || got == s {
			t.Errorf("pathSegment(%q) = %q", s, got)
		}
	}
	if got := pathSegment("0b7a-uid_1.2"); got != "0b7a-uid_1.2" {
		t.Errorf("safe segment changed: %q", got)
	}
}
