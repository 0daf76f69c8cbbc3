package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"
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

// parseShimDomain reads the shim VM's sizes and boot files from its XML.
func parseShimDomain(x string) (*rawVolumeVM, error) {
	var d libvirtxml.Domain
	if err := d.Unmarshal(x); err != nil {
		return nil, err
	}
	vm := &rawVolumeVM{Type: d.Type}
	if d.Memory != nil {
		mult := map[string]uint64{"": 1, "KiB": 1, "MiB": 1 << 10, "GiB": 1 << 20}[d.Memory.Unit]
		vm.MemoryKiB = uint64(d.Memory.Value) * mult
	}
	if d.VCPU != nil {
		vm.VCPUs = int(d.VCPU.Value)
		if d.VCPU.Current > 0 {
			vm.VCPUs = int(d.VCPU.Current)
		}
	}
	if d.OS != nil {
		vm.Kernel, vm.Initrd = d.OS.Kernel, d.OS.Initrd
		if d.OS.Type != nil {
			vm.Arch, vm.Machine = d.OS.Type.Arch, d.OS.Type.Machine
		}
	}
	if d.Devices != nil {
		vm.Emulator = d.Devices.Emulator
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

// domainXML renders the raw domain (b) for one run: the guest's boot
// files and size, one virtio-blk disk on the host block device and a
// serial console into a file. Nothing else the shim adds (config drive,
// NIC, agent channel, pinning) has a part in disk I/O.
func (vm *rawVolumeVM) domainXML(name, uuid, dev, consoleLog, cmdline string) ([]byte, error) {
	port := uint(0)
	d := libvirtxml.Domain{
		Type: vm.Type, Name: name, UUID: uuid,
		Memory: &libvirtxml.DomainMemory{Unit: "KiB", Value: uint(vm.MemoryKiB)},
		VCPU:   &libvirtxml.DomainVCPU{Value: uint(vm.VCPUs)},
		OS: &libvirtxml.DomainOS{
			Type:   &libvirtxml.DomainOSType{Arch: vm.Arch, Machine: vm.Machine, Type: "hvm"},
			Kernel: vm.Kernel, Initrd: vm.Initrd, Cmdline: cmdline,
		},
		Features:   &libvirtxml.DomainFeatureList{ACPI: &libvirtxml.DomainFeature{}, APIC: &libvirtxml.DomainFeatureAPIC{}},
		OnPoweroff: "destroy", OnCrash: "destroy",
		Devices: &libvirtxml.DomainDeviceList{
			Emulator: vm.Emulator,
			Disks: []libvirtxml.DomainDisk{{
				Device: "disk",
				Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: "raw", Cache: "none", IO: "native"},
				Source: &libvirtxml.DomainDiskSource{Block: &libvirtxml.DomainDiskSourceBlock{Dev: dev}},
				Target: &libvirtxml.DomainDiskTarget{Dev: "vdb", Bus: "virtio"},
				Serial: volumeSerial,
			}},
			Serials: []libvirtxml.DomainSerial{{
				Source: &libvirtxml.DomainChardevSource{File: &libvirtxml.DomainChardevSourceFile{Path: consoleLog}},
				Target: &libvirtxml.DomainSerialTarget{Port: &port},
			}},
		},
	}
	x, err := d.Marshal()
	return []byte(x), err
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
