package vmplan

import (
	"regexp"
	"strings"
	"testing"
)

func TestDomainNameStable(t *testing.T) {
	a := Identity{Namespace: "k8s.io", ContainerID: "c1", PodUID: "u1", PodNamespace: "prod", ContainerName: "vm"}
	b := a
	b.ContainerID = "c2" // a restarted container
	if a.DomainName() != b.DomainName() || a.UUID() != b.UUID() {
		t.Errorf("restart changed identity: %s/%s vs %s/%s", a.DomainName(), a.UUID(), b.DomainName(), b.UUID())
	}
	c := a
	c.PodUID = "u2"
	if a.DomainName() == c.DomainName() || a.UUID() == c.UUID() {
		t.Error("two pods share a domain name or uuid")
	}
	if !strings.HasPrefix(a.DomainName(), "kvm-prod-vm-") {
		t.Errorf("name %q", a.DomainName())
	}
	if !regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`).MatchString(a.UUID()) {
		t.Errorf("uuid %q", a.UUID())
	}
}

func TestDomainNameSanitises(t *testing.T) {
	v := Identity{Namespace: "default", ContainerID: "../../My VM<x>/" + strings.Repeat("a", 100)}
	n := v.DomainName()
	if !regexp.MustCompile(`^kvm-[a-z0-9.-]+$`).MatchString(n) || len(n) > 70 {
		t.Errorf("unsafe or long name %q", n)
	}
}
