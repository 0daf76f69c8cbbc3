package vm

import (
	"encoding/xml"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"
)

// Memory hot-add uses one virtio-mem device on guest NUMA cell 0: QEMU
// maps its whole size at start but gives the guest only what is
// requested, in blocks, and the guest's virtio_mem driver plugs and
// unplugs them. libvirt needs <maxMemory> and a guest NUMA cell for it.

// virtioMemBlockKiB is the device's block size without huge pages: the
// transparent huge page size, QEMU's default on x86.
const virtioMemBlockKiB = 2048

// sizeXML is a size as libvirt writes it, with its unit.
type sizeXML struct {
	Unit  string `xml:"unit,attr"`
	Value uint64 `xml:",chardata"`
}

// kib is the size in KiB.
func (k sizeXML) kib() (uint64, error) {
	switch k.Unit {
	case "", "KiB", "k", "K":
		return k.Value, nil
	case "MiB", "M":
		return k.Value * 1024, nil
	case "GiB", "G":
		return k.Value * 1024 * 1024, nil
	}
	return 0, fmt.Errorf("memory device size in unit %q", k.Unit)
}

// virtioMem is a running VM's virtio-mem device as libvirt reports it.
// libvirtxml (v1.12008.0) has no field for the <current> size inside the
// device's <target>, which libvirt writes only in live XML: current
// comes from a small parse of our own.
type virtioMem struct {
	dev     libvirtxml.DomainMemorydev
	current *sizeXML
}

// virtioMemFromXML finds the virtio-mem device in a domain's live XML;
// ok is false when the domain has none.
func virtioMemFromXML(desc string) (m virtioMem, ok bool, err error) {
	var dom libvirtxml.Domain
	if err := dom.Unmarshal(desc); err != nil {
		return m, false, err
	}
	var cur struct {
		Memories []struct {
			Current *sizeXML `xml:"target>current"`
		} `xml:"devices>memory"`
	}
	if err := xml.Unmarshal([]byte(desc), &cur); err != nil {
		return m, false, err
	}
	if dom.Devices == nil || len(cur.Memories) != len(dom.Devices.Memorydevs) {
		return m, false, nil
	}
	for i, dev := range dom.Devices.Memorydevs {
		if dev.Model == "virtio-mem" && dev.Target != nil {
			return virtioMem{dev: dev, current: cur.Memories[i].Current}, true, nil
		}
	}
	return m, false, nil
}

// MemoryBlockKiB is the virtio-mem block size of s: a huge page when
// guest memory is backed by them, else 2 MiB.
func MemoryBlockKiB(s *Spec) uint64 {
	return max(s.HugePageKiB, virtioMemBlockKiB)
}

// HotplugMemoryMiB is how much memory a VM of s can add live: from its
// boot memory to MaxMemoryMiB, in whole virtio-mem blocks.
func HotplugMemoryMiB(s *Spec) int {
	if s.MaxMemoryMiB <= s.MemoryMiB {
		return 0
	}
	blockMiB := int(MemoryBlockKiB(s) / 1024)
	return (s.MaxMemoryMiB - s.MemoryMiB) / blockMiB * blockMiB
}

// configureMemoryHotplug gives a VM that may grow its memory live a
// virtio-mem device with nothing plugged, <maxMemory> and, unless the
// pinning made them, one guest NUMA cell holding every vCPU and the boot
// memory.
func configureMemoryHotplug(s *Spec, d *libvirtxml.Domain) {
	size := HotplugMemoryMiB(s)
	if size == 0 {
		return
	}
	d.MaximumMemory = &libvirtxml.DomainMaxMemory{Slots: 1, Unit: "MiB", Value: uint(s.MemoryMiB + size)}
	if d.CPU == nil {
		d.CPU = &libvirtxml.DomainCPU{}
	}
	if d.CPU.Numa == nil {
		vcpus := max(s.VCPUs, s.MaxVCPUs)
		cell := libvirtxml.DomainCell{ID: uintPtr(0), CPUs: fmt.Sprintf("0-%d", vcpus-1), Memory: uint(s.MemoryMiB), Unit: "MiB"}
		if vcpus == 1 {
			cell.CPUs = "0"
		}
		d.CPU.Numa = &libvirtxml.DomainNuma{Cell: []libvirtxml.DomainCell{cell}}
	}
	d.Devices.Memorydevs = append(d.Devices.Memorydevs, libvirtxml.DomainMemorydev{
		Model: "virtio-mem",
		Target: &libvirtxml.DomainMemorydevTarget{
			Size:      &libvirtxml.DomainMemorydevTargetSize{Unit: "KiB", Value: uint(size) * 1024},
			Node:      &libvirtxml.DomainMemorydevTargetNode{Value: 0},
			Block:     &libvirtxml.DomainMemorydevTargetBlock{Unit: "KiB", Value: uint(MemoryBlockKiB(s))},
			Requested: &libvirtxml.DomainMemorydevTargetRequested{Unit: "KiB", Value: 0},
		},
	})
}

// PluggedMemory is a running VM's hot-added memory.
type PluggedMemory struct {
	RequestedMiB int // what the host asks the guest to have plugged
	CurrentMiB   int // what the guest has plugged now
	SizeMiB      int // the most it can plug
}

// liveMemoryDevice returns the VM's virtio-mem device from its live XML.
func (c *Conn) liveMemoryDevice(name string) (*libvirt.Libvirt, libvirt.Domain, virtioMem, error) {
	l, d, err := c.lookup(name)
	if err != nil {
		return nil, d, virtioMem{}, err
	}
	desc, err := l.DomainGetXMLDesc(d, 0)
	if err != nil {
		return nil, d, virtioMem{}, mapError(err, "get XML of domain "+name)
	}
	m, ok, err := virtioMemFromXML(desc)
	if err != nil {
		return nil, d, virtioMem{}, fmt.Errorf("parse XML of domain %s: %w", name, err)
	}
	if !ok {
		return nil, d, virtioMem{}, fmt.Errorf("domain %s has no virtio-mem device (started without a memory maximum above its memory): %w",
			name, errdefs.ErrFailedPrecondition)
	}
	return l, d, m, nil
}

func (m virtioMem) plugged() (PluggedMemory, error) {
	var p PluggedMemory
	t := m.dev.Target
	var sizes []sizeMiB
	if t.Requested != nil {
		sizes = append(sizes, sizeMiB{sizeXML{Unit: t.Requested.Unit, Value: uint64(t.Requested.Value)}, &p.RequestedMiB})
	}
	if m.current != nil {
		sizes = append(sizes, sizeMiB{*m.current, &p.CurrentMiB})
	}
	if t.Size != nil {
		sizes = append(sizes, sizeMiB{sizeXML{Unit: t.Size.Unit, Value: uint64(t.Size.Value)}, &p.SizeMiB})
	}
	for _, s := range sizes {
		kib, err := s.size.kib()
		if err != nil {
			return p, err
		}
		*s.out = int(kib / 1024)
	}
	return p, nil
}

// sizeMiB is a size and the MiB field it goes into.
type sizeMiB struct {
	size sizeXML
	out  *int
}

// Plugged returns the hot-added memory of a running VM.
func (c *Conn) Plugged(name string) (PluggedMemory, error) {
	_, _, m, err := c.liveMemoryDevice(name)
	if err != nil {
		return PluggedMemory{}, err
	}
	return m.plugged()
}

// RequestMemory asks the guest of a running VM to have mib MiB of
// hot-added memory plugged (a whole number of blocks, at most the
// device's size) and waits up to timeout for it to get there. It returns
// what the guest has plugged when it returns; an error when the guest
// did not follow in time (the request then stays: the caller decides
// whether to put the old one back).
func (c *Conn) RequestMemory(name string, mib int, timeout time.Duration) (PluggedMemory, error) {
	l, d, m, err := c.liveMemoryDevice(name)
	if err != nil {
		return PluggedMemory{}, err
	}
	// The update repeats the device as libvirt wrote it (source, alias,
	// address) so that libvirt finds it and sees that only requested
	// changed; it carries no current, which libvirtxml does not model.
	m.dev.Target.Requested = &libvirtxml.DomainMemorydevTargetRequested{Unit: "KiB", Value: uint(mib) * 1024}
	dev, err := m.dev.Marshal()
	if err != nil {
		return PluggedMemory{}, fmt.Errorf("memory device of domain %s: %w", name, err)
	}
	if err := l.DomainUpdateDeviceFlags(d, dev, libvirt.DomainDeviceModifyLive); err != nil {
		return PluggedMemory{}, mapError(err, fmt.Sprintf("request %d MiB of hot-added memory in domain %s", mib, name))
	}
	deadline := time.Now().Add(timeout)
	for {
		p, err := c.Plugged(name)
		if err != nil {
			return p, err
		}
		if p.CurrentMiB == mib {
			return p, nil
		}
		if time.Now().After(deadline) {
			return p, fmt.Errorf("the guest of domain %s has %d MiB of hot-added memory plugged %s after %d MiB were asked (no virtio_mem driver, "+
				"or memory it cannot give back): %w",
				name, p.CurrentMiB, timeout, mib, errdefs.ErrFailedPrecondition)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
