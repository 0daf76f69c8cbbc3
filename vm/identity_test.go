package vm

import (
	"strings"
	"testing"
)

// The identity a new shim recovers from libvirt is the one rendered.
func TestIdentityRoundTrip(t *testing.T) {
	s := goldenCases()["tcg-disk"]
	out, err := Render(&s)
	if err != nil {
		t.Fatal(err)
	}
	got, err := IdentityFromXML(string(out))
	if err != nil || got == nil || *got != *s.Identity {
		t.Fatalf("identity from rendered XML = %v, %v; want %v", got, err, *s.Identity)
	}
	// libvirt's live XML adds an imagelabel and keeps the dynamic label
	// of an LSM beside it.
	live := `<domain><seclabel type='dynamic' model='apparmor' relabel='yes'><label>libvirt-x</label></seclabel>` +
		`<seclabel type='static' model='dac' relabel='yes'><label>+1000000009:+1000000010</label>` +
		`<imagelabel>+1000000009:+1000000010</imagelabel></seclabel></domain>`
	if got, err := IdentityFromXML(live); err != nil || got == nil || *got != (Identity{1000000009, 1000000010}) {
		t.Fatalf("identity from live XML = %v, %v", got, err)
	}
	if got, err := IdentityFromXML(`<domain><seclabel type='dynamic' model='dac'/></domain>`); err != nil || got != nil {
		t.Fatalf("a domain without a static DAC label: %v, %v; want none", got, err)
	}
	byName := `<domain><seclabel type='static' model='dac'><label>libvirt-qemu:kvm</label></seclabel></domain>`
	if _, err := IdentityFromXML(byName); err == nil {
		t.Fatal("a DAC label by name parsed as an identity")
	}
}

func TestIdentityRootRefused(t *testing.T) {
	s := goldenCases()["tcg-disk"]
	s.Identity = &Identity{UID: 0, GID: 1000000007}
	if _, err := Render(&s); err == nil || !strings.Contains(err.Error(), "as root") {
		t.Fatalf("Render with uid 0 = %v, want a refusal", err)
	}
}
