package vm

import (
	"encoding/xml"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	"github.com/digitalocean/go-libvirt"
)

// Memory hot-add uses one virtio-mem device on guest NUMA cell 0: QEMU
// maps its whole size at start but gives the guest only what is
// requested, in blocks, and the guest's virtio_mem driver plugs and
// unplugs them. libvirt needs <maxMemory> and a guest NUMA cell for it.

// virtioMemBlockKiB is the device's block size without huge pages: the
// transparent huge page size, QEMU's default on x86.
const virtioMemBlockKiB = 2048

type maxMemoryXML struct {
	Slots int    `xml:"slots,attr"`
	Unit  string `xml:"unit,attr"`
	Value int    `xml:",chardata"`
}

// memoryDeviceXML is a <memory> device. Attrs and the raw source, alias
// and address come back from libvirt as they are: an update must repeat
// them for libvirt to find the device and see that only requested changed.
type memoryDeviceXML struct {
	XMLName xml.Name     `xml:"memory"`
	Attrs   []xml.Attr   `xml:",any,attr"`
	Source  *rawXML      `xml:"source,omitempty"`
	Target  memTargetXML `xml:"target"`
	Alias   *rawXML      `xml:"alias,omitempty"`
	Address *rawXML      `xml:"address,omitempty"`
}

// rawXML keeps an element's attributes and content as libvirt wrote them.
type rawXML struct {
	Attrs []xml.Attr `xml:",any,attr"`
	Inner []byte     `xml:",innerxml"`
}

type memTargetXML struct {
	Size      kibXML  `xml:"size"`
	Node      *int    `xml:"node"`
	Block     kibXML  `xml:"block"`
	Requested kibXML  `xml:"requested"`
	Current   *kibXML `xml:"current,omitempty"`
}

// kibXML is a size libvirt writes in KiB (the shim writes KiB too).
type kibXML struct {
	Unit  string `xml:"unit,attr"`
	Value uint64 `xml:",chardata"`
}

func (k kibXML) kib() (uint64, error) {
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
func configureMemoryHotplug(s *Spec, d *domainXML) {
	size := HotplugMemoryMiB(s)
	if size == 0 {
		return
	}
	d.MaxMemory = &maxMemoryXML{Slots: 1, Unit: "MiB", Value: s.MemoryMiB + size}
	if d.CPU == nil {
		d.CPU = &cpuXML{}
	}
	if d.CPU.NUMA == nil {
		vcpus := max(s.VCPUs, s.MaxVCPUs)
		d.CPU.NUMA = &cpuNUMAXML{Cells: []cellXML{{ID: 0, CPUs: fmt.Sprintf("0-%d", vcpus-1), Memory: s.MemoryMiB, Unit: "MiB"}}}
		if vcpus == 1 {
			d.CPU.NUMA.Cells[0].CPUs = "0"
		}
	}
	node := 0
	d.Devices.Memories = append(d.Devices.Memories, memoryDeviceXML{
		Attrs: []xml.Attr{{Name: xml.Name{Local: "model"}, Value: "virtio-mem"}},
		Target: memTargetXML{
			Size:      kibXML{Unit: "KiB", Value: uint64(size) * 1024},
			Node:      &node,
			Block:     kibXML{Unit: "KiB", Value: MemoryBlockKiB(s)},
			Requested: kibXML{Unit: "KiB", Value: 0},
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
func (c *Conn) liveMemoryDevice(name string) (*libvirt.Libvirt, libvirt.Domain, memoryDeviceXML, error) {
	l, d, err := c.lookup(name)
	if err != nil {
		return nil, d, memoryDeviceXML{}, err
	}
	desc, err := l.DomainGetXMLDesc(d, 0)
	if err != nil {
		return nil, d, memoryDeviceXML{}, mapError(err, "get XML of domain "+name)
	}
	var dom struct {
		Memories []memoryDeviceXML `xml:"devices>memory"`
	}
	if err := xml.Unmarshal([]byte(desc), &dom); err != nil {
		return nil, d, memoryDeviceXML{}, fmt.Errorf("parse XML of domain %s: %w", name, err)
	}
	for _, m := range dom.Memories {
		for _, a := range m.Attrs {
			if a.Name.Local == "model" && a.Value == "virtio-mem" {
				return l, d, m, nil
			}
		}
	}
	return nil, d, memoryDeviceXML{}, fmt.Errorf("domain %s has no virtio-mem device (started without a memory maximum above its memory): %w",
		name, errdefs.ErrFailedPrecondition)
}

func (m memoryDeviceXML) plugged() (PluggedMemory, error) {
	var p PluggedMemory
	for _, f := range []struct {
		k   *kibXML
		out *int
	}{{&m.Target.Requested, &p.RequestedMiB}, {m.Target.Current, &p.CurrentMiB}, {&m.Target.Size, &p.SizeMiB}} {
		if f.k == nil {
			continue
		}
		kib, err := f.k.kib()
		if err != nil {
			return p, err
		}
		*f.out = int(kib / 1024)
	}
	return p, nil
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
	m.Target.Requested = kibXML{Unit: "KiB", Value: uint64(mib) * 1024}
	m.Target.Current = nil
	dev, err := xml.Marshal(&m)
	if err != nil {
		return PluggedMemory{}, fmt.Errorf("memory device of domain %s: %w", name, err)
	}
	if err := l.DomainUpdateDeviceFlags(d, string(dev), libvirt.DomainDeviceModifyLive); err != nil {
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
