package shim

import (
	"slices"
	"testing"
)

func TestServeEnv(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want []string
	}{
		{[]string{"PATH=/bin"}, []string{"PATH=/bin", "GOMAXPROCS=2", "GODEBUG=memprofilerate=0"}},
		{[]string{"GODEBUG=gctrace=1", "A=b"}, []string{"A=b", "GOMAXPROCS=2", "GODEBUG=gctrace=1,memprofilerate=0"}},
		{[]string{"GODEBUG=memprofilerate=1"}, []string{"GOMAXPROCS=2", "GODEBUG=memprofilerate=1"}},
	} {
		if got := serveEnv(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("serveEnv(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
