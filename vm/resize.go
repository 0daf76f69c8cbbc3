package vm

import (
	"fmt"

	"github.com/digitalocean/go-libvirt"
)

// configureHotplug lets a VM grow to MaxVCPUs live: <vcpu current='N'>MAX</vcpu>.
// QEMU creates the missing vCPUs only when they are plugged.
func configureHotplug(s *Spec, d *domainXML) {
	if s.MaxVCPUs > s.VCPUs {
		d.VCPU.Current = s.VCPUs
		d.VCPU.Value = s.MaxVCPUs
	}
}

// SetVCPUs plugs or unplugs vCPUs of a running domain until n are
// present. libvirt waits for the guest to release a vCPU being unplugged
// and fails when it does not; the guest must online plugged ones itself.
func (c *Conn) SetVCPUs(name string, n int) error {
	l, d, err := c.lookup(name)
	if err != nil {
		return err
	}
	if err := l.DomainSetVcpusFlags(d, uint32(n), uint32(libvirt.DomainVCPULive)); err != nil {
		return mapError(err, fmt.Sprintf("set vCPUs of domain %s to %d", name, n))
	}
	return nil
}

// VCPUs returns how many vCPUs a running domain has now.
func (c *Conn) VCPUs(name string) (int, error) {
	l, d, err := c.lookup(name)
	if err != nil {
		return 0, err
	}
	n, err := l.DomainGetVcpusFlags(d, uint32(libvirt.DomainVCPULive))
	if err != nil {
		return 0, mapError(err, "get vCPUs of domain "+name)
	}
	return int(n), nil
}
