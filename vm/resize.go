package vm

import (
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"
)

// configureHotplug lets a VM grow to MaxVCPUs live: <vcpu current='N'>MAX</vcpu>.
// QEMU creates the missing vCPUs only when they are plugged.
func configureHotplug(s *Spec, d *libvirtxml.Domain) {
	if s.MaxVCPUs > s.VCPUs {
		d.VCPU.Current = uint(s.VCPUs)
		d.VCPU.Value = uint(s.MaxVCPUs)
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

// GuestVCPUTimeout is how long libvirt waits for the guest agent to take
// vCPUs offline or online (guest-set-vcpus). Under TCG here the guest
// offlines a CPU well within a second; a loaded host takes longer.
const GuestVCPUTimeout = 10 * time.Second

// SetGuestVCPUs asks the guest, through the QEMU guest agent, to have n
// vCPUs online: libvirt (virDomainSetVcpusFlags with VCPU_GUEST) offlines
// the highest-numbered ones first, never one the guest cannot offline
// (CPU 0), or onlines offline ones. QEMU keeps every vCPU thread; an
// offline vCPU runs nothing. libvirt waits for the agent up to timeout,
// then the domain's agent timeout goes back to AgentSyncTimeout (what
// Agent sets). No agent answering is ErrNoAgent (FailedPrecondition).
func (c *Conn) SetGuestVCPUs(name string, n int, timeout time.Duration) error {
	if n < 1 {
		return fmt.Errorf("set guest vCPUs of domain %s to %d: a guest needs at least one online vCPU: %w", name, n, errdefs.ErrInvalidArgument)
	}
	l, d, err := c.lookup(name)
	if err != nil {
		return err
	}
	if err := c.SetAgentTimeout(name, timeout); err != nil {
		return err
	}
	defer func() { _ = c.SetAgentTimeout(name, AgentSyncTimeout) }() // as Agent sets it; a failure only slows a "no agent" answer
	if err := l.DomainSetVcpusFlags(d, uint32(n), uint32(libvirt.DomainVCPUGuest)); err != nil {
		return fmt.Errorf("set guest vCPUs of domain %s to %d: %w", name, n, mapAgentError(err, name))
	}
	return nil
}

// GuestVCPUs returns how many vCPUs the guest has online, as its agent
// reports them (virDomainGetVcpusFlags with VCPU_GUEST).
func (c *Conn) GuestVCPUs(name string) (int, error) {
	l, d, err := c.lookup(name)
	if err != nil {
		return 0, err
	}
	n, err := l.DomainGetVcpusFlags(d, uint32(libvirt.DomainVCPUGuest))
	if err != nil {
		return 0, fmt.Errorf("get guest vCPUs of domain %s: %w", name, mapAgentError(err, name))
	}
	return int(n), nil
}
