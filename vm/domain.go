package vm

import (
	"encoding/xml"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/digitalocean/go-libvirt"
)

// QEMUPidDir is where libvirt's QEMU driver writes each running domain's
// pid file (<name>.pid).
const QEMUPidDir = "/run/libvirt/qemu"

// State is a domain's coarse state as the task service needs it.
type State struct {
	Running  bool       // QEMU is up (running, paused, shutting down, or holding a panicked guest)
	Paused   bool       // vCPUs suspended
	Panicked bool       // the guest's kernel panicked: QEMU is up, its vCPUs stopped (libvirt: crashed), until destroyed
	Reason   StopReason // when not running
}

// Stats are a running domain's resource counters.
type Stats struct {
	CPUTimeNs   uint64 // guest vCPU plus emulator CPU time
	RSSBytes    uint64 // resident memory of the QEMU process
	MemoryBytes uint64 // memory given to the guest
}

// Define creates or replaces the persistent definition of a domain.
func (c *Conn) Define(domainXML []byte) error {
	l, err := c.client()
	if err != nil {
		return err
	}
	if _, err := l.DomainDefineXML(string(domainXML)); err != nil {
		return mapError(err, "define domain")
	}
	return nil
}

func (c *Conn) lookup(name string) (*libvirt.Libvirt, libvirt.Domain, error) {
	l, err := c.client()
	if err != nil {
		return nil, libvirt.Domain{}, err
	}
	d, err := l.DomainLookupByName(name)
	if err != nil {
		return nil, libvirt.Domain{}, mapError(err, "look up domain "+name)
	}
	return l, d, nil
}

// Start boots a defined domain. With paused, QEMU starts with its vCPUs
// stopped, so the caller can attach to the console before the first byte
// of output, then call Resume.
func (c *Conn) Start(name string, paused bool) error {
	l, d, err := c.lookup(name)
	if err != nil {
		return err
	}
	var flags uint32
	if paused {
		flags = uint32(libvirt.DomainStartPaused)
	}
	if _, err := l.DomainCreateWithFlags(d, flags); err != nil {
		return mapError(err, "start domain "+name)
	}
	return nil
}

// Suspend pauses the guest's vCPUs.
func (c *Conn) Suspend(name string) error {
	l, d, err := c.lookup(name)
	if err != nil {
		return err
	}
	return wrapIf(l.DomainSuspend(d), "suspend domain "+name)
}

// Resume lets the guest's vCPUs run again.
func (c *Conn) Resume(name string) error {
	l, d, err := c.lookup(name)
	if err != nil {
		return err
	}
	return wrapIf(l.DomainResume(d), "resume domain "+name)
}

// Shutdown presses the guest's ACPI power button. A guest that ignores it
// keeps running.
func (c *Conn) Shutdown(name string) error {
	l, d, err := c.lookup(name)
	if err != nil {
		return err
	}
	return wrapIf(l.DomainShutdownFlags(d, libvirt.DomainShutdownAcpiPowerBtn), "power off domain "+name)
}

// Destroy stops QEMU at once.
func (c *Conn) Destroy(name string) error {
	l, d, err := c.lookup(name)
	if err != nil {
		return err
	}
	return wrapIf(l.DomainDestroyFlags(d, 0), "destroy domain "+name)
}

// Undefine removes the persistent definition of a stopped domain. A domain
// that is already gone is not an error.
func (c *Conn) Undefine(name string) error {
	l, d, err := c.lookup(name)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	flags := libvirt.DomainUndefineManagedSave | libvirt.DomainUndefineSnapshotsMetadata | libvirt.DomainUndefineNvram
	err = wrapIf(l.DomainUndefineFlags(d, flags), "undefine domain "+name)
	if errdefs.IsNotFound(err) {
		return nil
	}
	return err
}

// State returns whether the domain runs and, if not, why it stopped.
func (c *Conn) State(name string) (State, error) {
	l, d, err := c.lookup(name)
	if err != nil {
		return State{}, err
	}
	st, reason, err := l.DomainGetState(d, 0)
	if err != nil {
		return State{}, mapError(err, "get state of domain "+name)
	}
	return stateOf(libvirt.DomainState(st), reason), nil
}

// stateOf maps libvirt's state and reason. Its state "crashed" (with
// QEMU, reason "panicked") is a domain whose guest reported a kernel
// panic through its panic device and whose on_crash kept QEMU: QEMU is
// up, so the domain counts as running, panicked. (libvirt's QEMU driver
// sets "crashed" only on QEMU's GUEST_PANICKED event.)
func stateOf(st libvirt.DomainState, reason int32) State {
	switch st {
	case libvirt.DomainShutoff, libvirt.DomainNostate:
		return State{Reason: stopReasonFromShutoff(libvirt.DomainShutoffReason(reason))}
	case libvirt.DomainCrashed:
		return State{Running: true, Panicked: true}
	case libvirt.DomainPaused, libvirt.DomainPmsuspended:
		return State{Running: true, Paused: true}
	}
	return State{Running: true}
}

// Stats returns CPU time and memory of a running domain.
func (c *Conn) Stats(name string) (Stats, error) {
	l, d, err := c.lookup(name)
	if err != nil {
		return Stats{}, err
	}
	_, _, memKiB, _, cpuNs, err := l.DomainGetInfo(d)
	if err != nil {
		return Stats{}, mapError(err, "get info of domain "+name)
	}
	s := Stats{CPUTimeNs: cpuNs, MemoryBytes: memKiB * 1024}
	mem, err := l.DomainMemoryStats(d, uint32(libvirt.DomainMemoryStatNr), 0)
	if err != nil {
		return Stats{}, mapError(err, "get memory stats of domain "+name)
	}
	for _, m := range mem {
		if libvirt.DomainMemoryStatTags(m.Tag) == libvirt.DomainMemoryStatRss {
			s.RSSBytes = m.Val * 1024
		}
	}
	return s, nil
}

// PID returns the pid of the domain's QEMU process from libvirt's pid file.
func (c *Conn) PID(name string) (int, error) {
	b, err := os.ReadFile(filepath.Join(QEMUPidDir, name+".pid"))
	if err != nil {
		return 0, fmt.Errorf("read QEMU pid of domain %s: %w", name, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("QEMU pid file of domain %s holds %q", name, b)
	}
	return pid, nil
}

func wrapIf(err error, what string) error {
	if err == nil {
		return nil
	}
	return mapError(err, what)
}

// Metadata returns the shim's metadata stored in the domain.
func (c *Conn) Metadata(name string) (Metadata, error) {
	l, d, err := c.lookup(name)
	if err != nil {
		return Metadata{}, err
	}
	s, err := l.DomainGetMetadata(d, int32(libvirt.DomainMetadataElement), libvirt.OptString{MetadataNamespace}, libvirt.DomainAffectConfig)
	if err != nil {
		return Metadata{}, mapError(err, "get metadata of domain "+name)
	}
	// libvirt hands the element back without its namespace.
	var m struct {
		XMLName xml.Name `xml:"vm"`
		Metadata
	}
	if err := xml.Unmarshal([]byte(s), &m); err != nil {
		return Metadata{}, fmt.Errorf("parse metadata of domain %s: %w", name, err)
	}
	return m.Metadata, nil
}

// Domains lists the defined domains that carry the shim's metadata, with
// it. Domains without it belong to someone else and are skipped.
func (c *Conn) Domains() (map[string]Metadata, error) {
	l, err := c.client()
	if err != nil {
		return nil, err
	}
	doms, _, err := l.ConnectListAllDomains(1, 0)
	if err != nil {
		return nil, mapError(err, "list domains")
	}
	out := make(map[string]Metadata, len(doms))
	for _, d := range doms {
		m, err := c.Metadata(d.Name)
		if err != nil {
			continue // not ours, or gone since the listing
		}
		out[d.Name] = m
	}
	return out, nil
}
