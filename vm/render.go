package vm

import (
	"encoding/xml"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// A configurator fills in one concern of the domain from the spec. Render
// runs them in order; each is small, pure and tested through the golden
// files in testdata/.
type configurator func(*Spec, *domainXML)

var configurators = []configurator{
	configureIdentity,
	configureSize,
	configurePlatform,
	configurePinning,
	configureBoot,
	configureDisk,
	configureConfigDrive,
	configureVolumeDisks,
	configureShares,
	configureConsole,
	configureAgentChannel,
	configureDevices,
	configureHotplug,
	configureMemoryHotplug,
	configureSecLabel,
}

// Render validates the spec and returns the libvirt domain XML for it.
func Render(s *Spec) ([]byte, error) {
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("render domain %s: %w", s.Name, err)
	}
	var d domainXML
	for _, c := range configurators {
		c(s, &d)
	}
	out, err := xml.MarshalIndent(&d, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("render domain %s: %w", s.Name, err)
	}
	return append(out, '\n'), nil
}

func configureIdentity(s *Spec, d *domainXML) {
	d.Name = s.Name
	d.UUID = s.UUID
	d.Metadata = &metadataXML{VM: vmMetaXML{Metadata: s.Meta}}
}

func configureSize(s *Spec, d *domainXML) {
	d.Memory = sizeXML{Unit: "MiB", Value: s.MemoryMiB}
	d.VCPU = vcpuXML{Placement: "static", Value: s.VCPUs}
}

// configurePlatform sets the machine, acceleration and what happens when the
// guest stops. <acpi/> is required: without it the guest never sees the
// power button and a SIGTERM cannot power it off.
func configurePlatform(s *Spec, d *domainXML) {
	d.Type = "qemu"
	if s.Accel == AccelKVM {
		d.Type = "kvm"
		d.CPU = &cpuXML{Mode: "host-passthrough"}
	}
	d.OS.Type = osTypeXML{Arch: "x86_64", Machine: s.Machine, Value: "hvm"}
	d.Features = featuresXML{ACPI: &struct{}{}, APIC: &struct{}{}}
	d.Clock = clockXML{Offset: "utc"}
	// A guest poweroff or crash ends the task; a guest reboot keeps the same
	// QEMU process and so the same running task.
	d.OnPoweroff = "destroy"
	d.OnReboot = "restart"
	d.OnCrash = "destroy"
	d.Devices.Emulator = s.Emulator
}

// configurePinning binds vCPUs, emulator threads and memory to the host
// CPUs and NUMA nodes the placement chose, and backs memory with huge
// pages when asked. Huge pages come from memfd (QEMU's
// memory-backend-memfd with hugetlb=on): libvirt's file backing needs a
// hugetlbfs mount that libvirtd found when it started, which this
// project's hosts do not have ("hugetlbfs filesystem is not mounted"
// from libvirt 9.0 here), and memfd is what virtiofs shares need anyway.
func configurePinning(s *Spec, d *domainXML) {
	if s.HugePageKiB > 0 {
		d.MemoryBacking = &memoryBackingXML{
			HugePages: &hugePagesXML{Page: pageXML{Size: s.HugePageKiB, Unit: "KiB"}},
			Source:    &memorySourceXML{Type: "memfd"},
		}
	}
	p := s.Pinning
	if p == nil {
		return
	}
	d.VCPU.CPUSet = cpuList(p.CPUSet)
	if len(p.VCPUPins) > 0 || len(p.EmulatorCPUs) > 0 {
		d.CPUTune = &cputuneXML{}
		for i, cpus := range p.VCPUPins {
			d.CPUTune.VCPUPins = append(d.CPUTune.VCPUPins, vcpuPinXML{VCPU: i, CPUSet: cpuList(cpus)})
		}
		if len(p.EmulatorCPUs) > 0 {
			d.CPUTune.EmulatorPin = &emulatorPinXML{CPUSet: cpuList(p.EmulatorCPUs)}
		}
	}
	if len(p.MemoryNodes) > 0 {
		d.NUMATune = &numatuneXML{Memory: numaMemoryXML{Mode: "strict", Nodeset: cpuList(p.MemoryNodes)}}
	}
	if len(p.Cells) > 0 {
		if d.CPU == nil {
			d.CPU = &cpuXML{}
		}
		d.CPU.NUMA = &cpuNUMAXML{}
		for i, c := range p.Cells {
			d.CPU.NUMA.Cells = append(d.CPU.NUMA.Cells, cellXML{ID: i, CPUs: cpuList(c.VCPUs), Memory: c.MemoryMiB, Unit: "MiB"})
			if d.NUMATune != nil {
				d.NUMATune.MemNodes = append(d.NUMATune.MemNodes, memNodeXML{CellID: i, Mode: "strict", Nodeset: strconv.Itoa(c.HostNode)})
			}
		}
	}
}

// cpuList writes CPU or node numbers as libvirt wants them: "0-3,8,10-11".
func cpuList(v []int) string {
	s := append([]int(nil), v...)
	sort.Ints(s)
	var parts []string
	for i := 0; i < len(s); {
		j := i
		for j+1 < len(s) && s[j+1] == s[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", s[i], s[j]))
		} else {
			parts = append(parts, strconv.Itoa(s[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

func configureBoot(s *Spec, d *domainXML) {
	if k := s.Kernel; k != nil {
		d.OS.Kernel = k.Path
		d.OS.Initrd = k.Initrd
		d.OS.Cmdline = k.Cmdline
		return
	}
	d.OS.Boot = &bootXML{Dev: "hd"}
	// SeaBIOS mirrors its screen to the serial port, so the console shows
	// bootloaders and firmware that only print through the BIOS.
	d.OS.BIOS = &biosXML{UseSerial: "yes"}
}

func configureDisk(s *Spec, d *domainXML) {
	if s.Disk == nil {
		return
	}
	d.Devices.Disks = append(d.Devices.Disks, diskXML{
		Type:   "file",
		Device: "disk",
		Driver: diskDriverXML{Name: "qemu", Type: s.Disk.Format, Discard: "unmap"},
		Source: diskSourceXML{File: s.Disk.Path},
		Target: diskTargetXML{Dev: "vda", Bus: "virtio"},
	})
}

func configureConfigDrive(s *Spec, d *domainXML) {
	cd := s.ConfigDrive
	if cd == nil {
		return
	}
	disk := diskXML{
		Type:     "file",
		Device:   "disk",
		Driver:   diskDriverXML{Name: "qemu", Type: "raw"},
		Source:   diskSourceXML{File: cd.Path},
		Target:   diskTargetXML{Dev: "vdz", Bus: "virtio"},
		ReadOnly: &struct{}{},
	}
	if cd.Format == "iso9660" {
		disk.Device, disk.Target = "cdrom", diskTargetXML{Dev: "sdz", Bus: "scsi"}
		zero := 0
		d.Devices.Controllers = append(d.Devices.Controllers, controllerXML{Type: "scsi", Index: &zero, Model: "virtio-scsi"})
	}
	d.Devices.Disks = append(d.Devices.Disks, disk)
}

func configureConsole(s *Spec, d *domainXML) {
	d.Devices.Serials = append(d.Devices.Serials, serialXML{
		Type:   "unix",
		Source: serialSourceXML{Mode: "bind", Path: s.Console.Socket},
		Log:    &serialLogXML{File: s.Console.Log, Append: "on"},
		Target: serialTargetXML{Port: 0},
	})
}

// AgentPort is the virtio-serial port name the QEMU guest agent listens
// on in the guest (qemu-ga's default).
const AgentPort = "org.qemu.guest_agent.0"

// configureAgentChannel gives every VM the port of the QEMU guest agent,
// through which exec runs commands in the guest. It must be there from
// the start: a virtio-serial port cannot be hot-plugged without a
// controller already in the domain. libvirt connects to the socket itself
// and serves it through its agent API; the shim never opens it.
func configureAgentChannel(s *Spec, d *domainXML) {
	d.Devices.Channels = append(d.Devices.Channels, channelXML{
		Type:   "unix",
		Source: channelSourceXML{Mode: "bind"},
		Target: channelTargetXML{Type: "virtio", Name: AgentPort},
	})
	d.Devices.Controllers = append(d.Devices.Controllers, virtioSerialController(len(d.Devices.Channels)))
}

// virtioSerialController is the controller of a VM's virtio-serial
// channels, sized to them: port 0 is the console's (unused here), the
// channels take 1 to n. libvirt's default controller has 31 ports, each
// two virtqueues QEMU gives a host notifier (an eventfd its main loop
// polls on every iteration, used or not): 64 of a VM's 77 descriptors.
// Under TCG that polling cost the shim's VM ~1.5x the main-loop CPU of a
// domain without the controller for the same disk I/O (kvmbench volumes).
func virtioSerialController(channels int) controllerXML {
	zero := 0
	return controllerXML{Type: "virtio-serial", Index: &zero, Ports: channels + 1}
}

// configureDevices adds the small fixed devices: a virtio RNG so guests do
// not stall on entropy at boot, no balloon (memory is fixed per VM) and no
// USB controller (nothing plugs into it; libvirt would add one by default).
func configureDevices(s *Spec, d *domainXML) {
	d.Devices.Controllers = append(d.Devices.Controllers, controllerXML{Type: "usb", Model: "none"})
	d.Devices.RNGs = append(d.Devices.RNGs, rngXML{
		Model:   "virtio",
		Backend: rngBackendXML{Model: "random", Value: "/dev/urandom"},
	})
	d.Devices.MemBalloon = &memBalloonXML{Model: "none"}
}
