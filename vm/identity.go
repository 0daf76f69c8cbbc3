package vm

import (
	"fmt"
	"strconv"
	"strings"

	"libvirt.org/go/libvirtxml"
)

// Identity is the host uid and gid a VM's QEMU runs under, recorded in
// the domain as libvirt's static DAC label: libvirt starts that domain's
// QEMU as uid:gid (in place of qemu.conf's user and group) and, with
// relabel on, gives the domain's disks, kernel, config drive and console
// to it while the domain runs. On a host with AppArmor or SELinux the
// driver's own dynamic label stays on top: libvirt keeps one <seclabel>
// per security model, and this one names the dac model only.
type Identity struct {
	UID, GID uint32
}

// Label is the DAC label as libvirt reads it: "+UID:+GID", numbers that
// are never looked up as names.
func (id Identity) Label() string { return fmt.Sprintf("+%d:+%d", id.UID, id.GID) }

// ParseDACLabel reads a label of the form Label writes.
func ParseDACLabel(s string) (Identity, error) {
	u, g, ok := strings.Cut(strings.TrimSpace(s), ":")
	if !ok {
		return Identity{}, fmt.Errorf("DAC label %q: want +UID:+GID", s)
	}
	uid, err := strconv.ParseUint(strings.TrimPrefix(u, "+"), 10, 32)
	if err != nil {
		return Identity{}, fmt.Errorf("DAC label %q: uid: %w", s, err)
	}
	gid, err := strconv.ParseUint(strings.TrimPrefix(g, "+"), 10, 32)
	if err != nil {
		return Identity{}, fmt.Errorf("DAC label %q: gid: %w", s, err)
	}
	return Identity{UID: uint32(uid), GID: uint32(gid)}, nil
}

// configureSecLabel runs the VM's QEMU under its own identity.
func configureSecLabel(s *Spec, d *libvirtxml.Domain) {
	if s.Identity == nil {
		return
	}
	d.SecLabel = append(d.SecLabel, libvirtxml.DomainSecLabel{Type: "static", Model: "dac", Relabel: "yes", Label: s.Identity.Label()})
}

// IdentityFromXML finds the static DAC label in a domain's XML; nil when
// the domain runs under qemu.conf's shared user.
func IdentityFromXML(domainXML string) (*Identity, error) {
	var d libvirtxml.Domain
	if err := d.Unmarshal(domainXML); err != nil {
		return nil, fmt.Errorf("parse domain XML: %w", err)
	}
	for _, l := range d.SecLabel {
		if l.Model == "dac" && l.Type == "static" {
			id, err := ParseDACLabel(l.Label)
			if err != nil {
				return nil, err
			}
			return &id, nil
		}
	}
	return nil, nil
}

// Identity returns the identity the domain's QEMU runs under, as its
// static DAC label records it; nil for a domain without one.
func (c *Conn) Identity(name string) (*Identity, error) {
	l, d, err := c.lookup(name)
	if err != nil {
		return nil, err
	}
	desc, err := l.DomainGetXMLDesc(d, 0)
	if err != nil {
		return nil, mapError(err, "get XML of domain "+name)
	}
	id, err := IdentityFromXML(desc)
	if err != nil {
		return nil, fmt.Errorf("domain %s: %w", name, err)
	}
	return id, nil
}
