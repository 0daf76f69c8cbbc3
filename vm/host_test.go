package vm

import (
	"strings"
	"testing"
)

func TestChooseAccel(t *testing.T) {
	usable := KVMInfo{Usable: true}
	missing := KVMInfo{Reason: "/dev/kvm: no such file"}
	cases := []struct {
		mode    string
		kvm     KVMInfo
		want    Accel
		warn    bool
		wantErr bool
	}{
		{"auto", usable, AccelKVM, false, false},
		{"", usable, AccelKVM, false, false},
		{"auto", missing, AccelTCG, true, false},
		{"kvm", usable, AccelKVM, false, false},
		{"kvm", missing, "", false, true},
		{"tcg", usable, AccelTCG, false, false},
		{"hvf", usable, "", false, true},
	}
	for _, tc := range cases {
		got, warn, err := ChooseAccel(tc.mode, tc.kvm)
		if (err != nil) != tc.wantErr || got != tc.want || (warn != "") != tc.warn {
			t.Errorf("ChooseAccel(%q, %+v) = %q, %q, %v", tc.mode, tc.kvm, got, warn, err)
		}
		if tc.warn && !strings.Contains(warn, tc.kvm.Reason) {
			t.Errorf("warning %q does not give the reason %q", warn, tc.kvm.Reason)
		}
	}
}
