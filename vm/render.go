package vm

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"libvirt.org/go/libvirtxml"
)

// A configurator fills in one concern of the domain from the spec. Render
// runs them in order; each is small, pure and tested through the golden
// files in testdata/. The domain is libvirtxml's: libvirt's own Go model
// of its schema, so every element and attribute we set has the name and
// place libvirt parses, and encoding/xml does all escaping.
type configurator func(*Spec, *libvirtxml.Domain)

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
	configurePanic,
	configureHotplug,
	configureMemoryHotplug,
	configureSecLabel,
}

// Render validates the spec and returns the libvirt domain XML for it.
func Render(s *Spec) ([]byte, error) {
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("render domain %s: %w", s.Name, err)
	}
	d, err := buildDomain(s)
	if err != nil {
		return nil, fmt.Errorf("render domain %s: %w", s.Name, err)
	}
	out, err := d.Marshal()
	if err != nil {
		return nil, fmt.Errorf("render domain %s: %w", s.Name, err)
	}
	return append([]byte(out), '\n'), nil
}

// buildDomain runs the configurators on an empty domain and adds the
// shim's metadata.
func buildDomain(s *Spec) (*libvirtxml.Domain, error) {
	d := &libvirtxml.Domain{OS: &libvirtxml.DomainOS{}, Devices: &libvirtxml.DomainDeviceList{}}
	for _, c := range configurators {
		c(s, d)
	}
	meta, err := domainMetadata(s.Meta)
	if err != nil {
		return nil, err
	}
	d.Metadata = meta
	return d, nil
}

func configureIdentity(s *Spec, d *libvirtxml.Domain) {
	d.Name = s.Name
	d.UUID = s.UUID
}

func configureSize(s *Spec, d *libvirtxml.Domain) {
	d.Memory = &libvirtxml.DomainMemory{Unit: "MiB", Value: uint(s.MemoryMiB)}
	d.VCPU = &libvirtxml.DomainVCPU{Placement: "static", Value: uint(s.VCPUs)}
}

// configurePlatform sets the machine, acceleration and what happens when the
// guest stops. <acpi/> is required: without it the guest never sees the
// power button and a SIGTERM cannot power it off.
func configurePlatform(s *Spec, d *libvirtxml.Domain) {
	d.Type = "qemu"
	if s.Accel == AccelKVM {
		d.Type = "kvm"
		d.CPU = &libvirtxml.DomainCPU{Mode: "host-passthrough"}
	}
	d.OS.Type = &libvirtxml.DomainOSType{Arch: "x86_64", Machine: s.Machine, Type: "hvm"}
	d.Features = &libvirtxml.DomainFeatureList{ACPI: &libvirtxml.DomainFeature{}, APIC: &libvirtxml.DomainFeatureAPIC{}}
	d.Clock = &libvirtxml.DomainClock{Offset: "utc"}
	// A guest poweroff ends the task; a guest reboot keeps the same QEMU
	// process and so the same running task. A guest kernel panic (told by
	// the panic device, configurePanic) leaves QEMU paused and the domain
	// "crashed, panicked" to libvirt: the shim sees that state, destroys
	// the domain and records the panic as such. With "destroy" libvirt
	// would end QEMU itself and record the stop as "crashed", which is
	// also what it records when QEMU is killed or dies: the panic could
	// not be told apart (see docs/lifecycle.md).
	d.OnPoweroff = "destroy"
	d.OnReboot = "restart"
	d.OnCrash = "preserve"
	d.Devices.Emulator = s.Emulator
}

// configurePinning binds vCPUs, emulator threads and memory to the host
// CPUs and NUMA nodes the placement chose, and backs memory with huge
// pages when asked. Huge pages come from memfd (QEMU's
// memory-backend-memfd with hugetlb=on): libvirt's file backing needs a
// hugetlbfs mount that libvirtd found when it started, which this
// project's hosts do not have ("hugetlbfs filesystem is not mounted"
// from libvirt 9.0 here), and memfd is what virtiofs shares need anyway.
func configurePinning(s *Spec, d *libvirtxml.Domain) {
	if s.HugePageKiB > 0 {
		d.MemoryBacking = &libvirtxml.DomainMemoryBacking{
			MemoryHugePages: &libvirtxml.DomainMemoryHugepages{
				Hugepages: []libvirtxml.DomainMemoryHugepage{{Size: uint(s.HugePageKiB), Unit: "KiB"}},
			},
			MemorySource: &libvirtxml.DomainMemorySource{Type: "memfd"},
		}
	}
	p := s.Pinning
	if p == nil {
		return
	}
	d.VCPU.CPUSet = cpuList(p.CPUSet)
	if len(p.VCPUPins) > 0 || len(p.EmulatorCPUs) > 0 {
		d.CPUTune = &libvirtxml.DomainCPUTune{}
		for i, cpus := range p.VCPUPins {
			d.CPUTune.VCPUPin = append(d.CPUTune.VCPUPin, libvirtxml.DomainCPUTuneVCPUPin{VCPU: uint(i), CPUSet: cpuList(cpus)})
		}
		if len(p.EmulatorCPUs) > 0 {
			d.CPUTune.EmulatorPin = &libvirtxml.DomainCPUTuneEmulatorPin{CPUSet: cpuList(p.EmulatorCPUs)}
		}
	}
	if len(p.MemoryNodes) > 0 {
		d.NUMATune = &libvirtxml.DomainNUMATune{Memory: &libvirtxml.DomainNUMATuneMemory{Mode: "strict", Nodeset: cpuList(p.MemoryNodes)}}
	}
	if len(p.Cells) > 0 {
		if d.CPU == nil {
			d.CPU = &libvirtxml.DomainCPU{}
		}
		d.CPU.Numa = &libvirtxml.DomainNuma{}
		for i, c := range p.Cells {
			d.CPU.Numa.Cell = append(d.CPU.Numa.Cell,
				libvirtxml.DomainCell{ID: uintPtr(i), CPUs: cpuList(c.VCPUs), Memory: uint(c.MemoryMiB), Unit: "MiB"})
			if d.NUMATune != nil {
				d.NUMATune.MemNodes = append(d.NUMATune.MemNodes,
					libvirtxml.DomainNUMATuneMemNode{CellID: uint(i), Mode: "strict", Nodeset: strconv.Itoa(c.HostNode)})
			}
		}
	}
}

// uintPtr is a pointer to n, for libvirtxml's optional numeric attributes.
func uintPtr(n int) *uint {
	u := uint(n)
	return &u
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

func configureBoot(s *Spec, d *libvirtxml.Domain) {
	if k := s.Kernel; k != nil {
		d.OS.Kernel = k.Path
		d.OS.Initrd = k.Initrd
		d.OS.Cmdline = k.Cmdline
		return
	}
	d.OS.BootDevices = []libvirtxml.DomainBootDevice{{Dev: "hd"}}
	// SeaBIOS mirrors its screen to the serial port, so the console shows
	// bootloaders and firmware that only print through the BIOS.
	d.OS.BIOS = &libvirtxml.DomainBIOS{UseSerial: "yes"}
}

func configureDisk(s *Spec, d *libvirtxml.Domain) {
	if s.Disk == nil {
		return
	}
	d.Devices.Disks = append(d.Devices.Disks, libvirtxml.DomainDisk{
		Device: "disk",
		Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: s.Disk.Format, Discard: "unmap"},
		Source: fileSource(s.Disk.Path),
		Target: &libvirtxml.DomainDiskTarget{Dev: "vda", Bus: "virtio"},
	})
}

// fileSource is the source of a disk of type file (libvirtxml derives
// the disk's type from which source is set).
func fileSource(path string) *libvirtxml.DomainDiskSource {
	return &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: path}}
}

func configureConfigDrive(s *Spec, d *libvirtxml.Domain) {
	cd := s.ConfigDrive
	if cd == nil {
		return
	}
	disk := libvirtxml.DomainDisk{
		Device:   "disk",
		Driver:   &libvirtxml.DomainDiskDriver{Name: "qemu", Type: "raw"},
		Source:   fileSource(cd.Path),
		Target:   &libvirtxml.DomainDiskTarget{Dev: "vdz", Bus: "virtio"},
		ReadOnly: &libvirtxml.DomainDiskReadOnly{},
	}
	if cd.Format == "iso9660" {
		disk.Device, disk.Target = "cdrom", &libvirtxml.DomainDiskTarget{Dev: "sdz", Bus: "scsi"}
		d.Devices.Controllers = append(d.Devices.Controllers, libvirtxml.DomainController{Type: "scsi", Index: uintPtr(0), Model: "virtio-scsi"})
	}
	d.Devices.Disks = append(d.Devices.Disks, disk)
}

func configureConsole(s *Spec, d *libvirtxml.Domain) {
	d.Devices.Serials = append(d.Devices.Serials, libvirtxml.DomainSerial{
		Source: &libvirtxml.DomainChardevSource{UNIX: &libvirtxml.DomainChardevSourceUNIX{Mode: "bind", Path: s.Console.Socket}},
		Log:    &libvirtxml.DomainChardevLog{File: s.Console.Log, Append: "on"},
		Target: &libvirtxml.DomainSerialTarget{Port: uintPtr(0)},
	})
}

// AgentPort is the virtio-serial port name the QEMU guest agent listens
// on in the guest (qemu-ga's default).
const AgentPort = "org.qemu.guest_agent.0"

// configureAgentChannel gives every VM the port of the QEMU guest agent,
// through which exec runs commands in the guest. It must be there from
// the start: a virtio-serial port cannot be hot-plugged without a
// controller already in the domain. libvirt connects to the socket itself
// and serves it through its agent API; the shim never opens it. With no
// path in the channel's source, libvirt picks the socket's place itself
// (under its own state directory, out of the VM dir).
func configureAgentChannel(s *Spec, d *libvirtxml.Domain) {
	d.Devices.Channels = append(d.Devices.Channels, libvirtxml.DomainChannel{
		Source: &libvirtxml.DomainChardevSource{UNIX: &libvirtxml.DomainChardevSourceUNIX{Mode: "bind"}},
		Target: &libvirtxml.DomainChannelTarget{VirtIO: &libvirtxml.DomainChannelTargetVirtIO{Name: AgentPort}},
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
func virtioSerialController(channels int) libvirtxml.DomainController {
	ports := uint(channels + 1)
	return libvirtxml.DomainController{Type: "virtio-serial", Index: uintPtr(0),
		VirtIOSerial: &libvirtxml.DomainControllerVirtIOSerial{Ports: &ports}}
}

// configurePanic gives every VM QEMU's pvpanic device, through which a
// guest kernel tells the host that it panicked (Linux: the pvpanic and
// pvpanic-mmio modules, which bind to its ACPI device QEMU0001; Windows:
// the virtio-win pvpanic driver). Model isa is the one libvirt 9.0 offers
// for x86 guests (pvpanic-pci, model pvpanic, came in 9.1); it sits on
// the ISA bus of both pc and q35, at I/O port 0x505, which libvirt fills in.
// Without the device a panicked guest halts or reboots (its kernel's
// panic=) with the task still running.
func configurePanic(s *Spec, d *libvirtxml.Domain) {
	d.Devices.Panics = append(d.Devices.Panics, libvirtxml.DomainPanic{Model: "isa"})
}

// configureDevices adds the small fixed devices: a virtio RNG so guests do
// not stall on entropy at boot, no balloon (memory is fixed per VM) and no
// USB controller (nothing plugs into it; libvirt would add one by default).
// The USB controller carries an empty USB part as libvirtxml parses one
// back, so a rendered domain reads back equal to the one built.
func configureDevices(s *Spec, d *libvirtxml.Domain) {
	d.Devices.Controllers = append(d.Devices.Controllers,
		libvirtxml.DomainController{Type: "usb", Model: "none", USB: &libvirtxml.DomainControllerUSB{}})
	d.Devices.RNGs = append(d.Devices.RNGs, libvirtxml.DomainRNG{
		Model:   "virtio",
		Backend: &libvirtxml.DomainRNGBackend{Random: &libvirtxml.DomainRNGBackendRandom{Device: "/dev/urandom"}},
	})
	d.Devices.MemBalloon = &libvirtxml.DomainMemBalloon{Model: "none"}
}
