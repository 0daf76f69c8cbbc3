package main

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/digitalocean/go-libvirt"
)

// The volumes section's variant (b): the shim's VM, copied into a raw
// libvirt domain written by hand, with the same loop device as its one
// disk.

// rawVolumeVM is what the raw domain (b) shares with the shim's VM: the
// direct-boot kernel and initrd (copied), memory, vCPUs, machine type and
// emulator.
type rawVolumeVM struct {
	Type, Arch, Machine, Emulator string
	Kernel, Initrd                string
	MemoryKiB                     uint64
	VCPUs                         int
}

// shimDomainXML is the part of the shim's domain XML the raw domain copies.
type shimDomainXML struct {
	Type   string `xml:"type,attr"`
	Memory struct {
		Unit  string `xml:"unit,attr"`
		Value uint64 `xml:",chardata"`
	} `xml:"memory"`
	VCPU struct {
		Current int `xml:"current,attr"`
		Count   int `xml:",chardata"`
	} `xml:"vcpu"`
	OS struct {
		Type struct {
			Arch    string `xml:"arch,attr"`
			Machine string `xml:"machine,attr"`
		} `xml:"type"`
		Kernel string `xml:"kernel"`
		Initrd string `xml:"initrd"`
	} `xml:"os"`
	Emulator string `xml:"devices>emulator"`
}

// parseShimDomain reads the shim VM's sizes and boot files from its XML.
func parseShimDomain(x string) (*rawVolumeVM, error) {
	var d shimDomainXML
	if err := xml.Unmarshal([]byte(x), &d); err != nil {
		return nil, err
	}
	mult := map[string]uint64{"KiB": 1, "MiB": 1 << 10, "GiB": 1 << 20}[d.Memory.Unit]
	vm := &rawVolumeVM{Type: d.Type, Arch: d.OS.Type.Arch, Machine: d.OS.Type.Machine, Emulator: d.Emulator,
		Kernel: d.OS.Kernel, Initrd: d.OS.Initrd, MemoryKiB: d.Memory.Value * mult, VCPUs: d.VCPU.Count}
	if d.VCPU.Current > 0 {
		vm.VCPUs = d.VCPU.Current
	}
	if vm.Kernel == "" || vm.MemoryKiB == 0 || vm.VCPUs == 0 || vm.Emulator == "" {
		return nil, fmt.Errorf("no direct-boot kernel, memory, vCPUs or emulator in the shim's domain XML:\n%s", x)
	}
	return vm, nil
}

// captureRawVolumeVM reads the running shim VM's XML and copies its
// kernel and initrd into rawDir.
func captureRawVolumeVM(l *libvirt.Libvirt, d *daemon, rawDir string) (*rawVolumeVM, error) {
	x, err := onlyShimDomainXML(l, d)
	if err != nil {
		return nil, err
	}
	vm, err := parseShimDomain(x)
	if err != nil {
		return nil, err
	}
	files := filepath.Join(rawDir, "volumes-files")
	if err := os.MkdirAll(files, 0o755); err != nil {
		return nil, err
	}
	for _, p := range []*string{&vm.Kernel, &vm.Initrd} {
		if *p == "" {
			continue
		}
		dst := filepath.Join(files, filepath.Base(*p))
		if err := copyFile(*p, dst, 0o644); err != nil {
			return nil, err
		}
		*p = dst
	}
	return vm, nil
}

// rawDomainXML is the raw domain (b), written by hand: the guest's boot
// files and size, one virtio-blk disk on the host block device and a
// serial console into a file. Nothing else the shim adds (config drive,
// NIC, agent channel, pinning) has a part in disk I/O.
type rawDomainXML struct {
	XMLName    xml.Name `xml:"domain"`
	Type       string   `xml:"type,attr"`
	Name       string   `xml:"name"`
	UUID       string   `xml:"uuid"`
	Memory     rawMemoryXML
	VCPU       int        `xml:"vcpu"`
	OS         rawOSXML   `xml:"os"`
	Features   rawFeatXML `xml:"features"`
	OnPoweroff string     `xml:"on_poweroff"`
	OnCrash    string     `xml:"on_crash"`
	Devices    rawDevsXML `xml:"devices"`
}

type rawMemoryXML struct {
	XMLName xml.Name `xml:"memory"`
	Unit    string   `xml:"unit,attr"`
	Value   uint64   `xml:",chardata"`
}

type rawOSXML struct {
	Type struct {
		Arch    string `xml:"arch,attr,omitempty"`
		Machine string `xml:"machine,attr,omitempty"`
		Value   string `xml:",chardata"`
	} `xml:"type"`
	Kernel  string `xml:"kernel"`
	Initrd  string `xml:"initrd,omitempty"`
	Cmdline string `xml:"cmdline"`
}

type rawFeatXML struct {
	ACPI struct{} `xml:"acpi"`
	APIC struct{} `xml:"apic"`
}

type rawDevsXML struct {
	Emulator string `xml:"emulator"`
	Disk     struct {
		Type   string `xml:"type,attr"`
		Device string `xml:"device,attr"`
		Driver struct {
			Name  string `xml:"name,attr"`
			Type  string `xml:"type,attr"`
			Cache string `xml:"cache,attr"`
			IO    string `xml:"io,attr"`
		} `xml:"driver"`
		Source struct {
			Dev string `xml:"dev,attr"`
		} `xml:"source"`
		Target struct {
			Dev string `xml:"dev,attr"`
			Bus string `xml:"bus,attr"`
		} `xml:"target"`
		Serial string `xml:"serial"`
	} `xml:"disk"`
	Serial struct {
		Type   string `xml:"type,attr"`
		Source struct {
			Path string `xml:"path,attr"`
		} `xml:"source"`
		Target struct {
			Port int `xml:"port,attr"`
		} `xml:"target"`
	} `xml:"serial"`
}

// domainXML renders the raw domain for one run.
func (vm *rawVolumeVM) domainXML(name, uuid, dev, consoleLog, cmdline string) ([]byte, error) {
	d := rawDomainXML{Type: vm.Type, Name: name, UUID: uuid, VCPU: vm.VCPUs, OnPoweroff: "destroy", OnCrash: "destroy"}
	d.Memory.Unit, d.Memory.Value = "KiB", vm.MemoryKiB
	d.OS.Type.Arch, d.OS.Type.Machine, d.OS.Type.Value = vm.Arch, vm.Machine, "hvm"
	d.OS.Kernel, d.OS.Initrd, d.OS.Cmdline = vm.Kernel, vm.Initrd, cmdline
	d.Devices.Emulator = vm.Emulator
	k := &d.Devices.Disk
	k.Type, k.Device, k.Serial = "block", "disk", volumeSerial
	k.Driver.Name, k.Driver.Type, k.Driver.Cache, k.Driver.IO = "qemu", "raw", "none", "native"
	k.Source.Dev = dev
	k.Target.Dev, k.Target.Bus = "vdb", "virtio"
	d.Devices.Serial.Type, d.Devices.Serial.Source.Path = "file", consoleLog
	return xml.MarshalIndent(d, "", "  ")
}

// run boots the raw domain on the block device, waits for the guest's
// figures, and destroys and undefines it. Its QEMU runs in a cgroup of
// its own below /kvmbench, beside the pods' (a pod's QEMU is in its
// container's cgroup), joined while the domain is paused: this host's
// libvirt leaves the cpu controller alone, so QEMU would otherwise stay in
// the root cpu cgroup, where each of its threads weighs as much as a whole
// pod group when other users load the cores.
//
// It runs in round i on vb's loop device, with iobench as the guest's
// kvm-guest.iobench= argument.
func (vm *rawVolumeVM) run(ctx context.Context, vb *volBench, i int, iobench string) (_ string, _ float64, retErr error) {
	l, h, dev := vb.l, vb.h, vb.loop
	name := fmt.Sprintf("kvmbench-vol-%d-%d", os.Getpid(), i)
	runDir := filepath.Join(vb.e.rawDir, fmt.Sprintf("volumes-run-%d", i))
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		return "", 0, err
	}
	defer os.RemoveAll(runDir)
	consoleLog := filepath.Join(runDir, "console.log")
	x, err := vm.domainXML(name, newUUID(), dev, consoleLog, volumeCmdline+iobench)
	if err != nil {
		return "", 0, err
	}
	dom, err := l.DomainDefineXML(string(x))
	if err != nil {
		return "", 0, fmt.Errorf("define: %w", err)
	}
	defer func() {
		_ = l.DomainDestroy(dom)
		retErr = errors.Join(retErr, l.DomainUndefine(dom))
	}()
	if _, err = l.DomainCreateWithFlags(dom, uint32(libvirt.DomainStartPaused)); err != nil {
		return "", 0, fmt.Errorf("create: %w", err)
	}
	g, err := h.Group("/kvmbench/" + name)
	if err != nil {
		return "", 0, err
	}
	if _, err = g.Create(); err != nil {
		return "", 0, err
	}
	defer func() {
		_ = l.DomainDestroy(dom) // before the group goes: it must be empty
		retErr = errors.Join(retErr, g.Remove())
	}()
	pid, err := os.ReadFile(filepath.Join("/run/libvirt/qemu", name+".pid"))
	if err != nil {
		return "", 0, fmt.Errorf("QEMU's pid: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(pid)))
	if err != nil {
		return "", 0, fmt.Errorf("QEMU's pid file: %q", pid)
	}
	if err := g.Join(n); err != nil {
		return "", 0, err
	}
	if err := l.DomainResume(dom); err != nil {
		return "", 0, fmt.Errorf("resume: %w", err)
	}
	return waitIO(ctx, func() string { return consoleLog }, g)
}
