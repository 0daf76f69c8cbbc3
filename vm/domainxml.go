package vm

import "encoding/xml"

// MetadataNamespace is the XML namespace of the shim's element inside the
// domain's <metadata>.
const MetadataNamespace = "https://github.com/kvm-shim/containerd-shim-kvm-v1/metadata/v1"

// The types below are the subset of libvirt's domain schema that we render.
// They are hand written because no libvirtxml module is obtainable here; keep
// them small and let encoding/xml do all escaping.

type domainXML struct {
	XMLName       xml.Name          `xml:"domain"`
	Type          string            `xml:"type,attr"`
	Name          string            `xml:"name"`
	UUID          string            `xml:"uuid"`
	Metadata      *metadataXML      `xml:"metadata,omitempty"`
	MaxMemory     *maxMemoryXML     `xml:"maxMemory,omitempty"`
	Memory        sizeXML           `xml:"memory"`
	MemoryBacking *memoryBackingXML `xml:"memoryBacking,omitempty"`
	VCPU          vcpuXML           `xml:"vcpu"`
	CPUTune       *cputuneXML       `xml:"cputune,omitempty"`
	NUMATune      *numatuneXML      `xml:"numatune,omitempty"`
	OS            osXML             `xml:"os"`
	Features      featuresXML       `xml:"features"`
	CPU           *cpuXML           `xml:"cpu,omitempty"`
	Clock         clockXML          `xml:"clock"`
	OnPoweroff    string            `xml:"on_poweroff"`
	OnReboot      string            `xml:"on_reboot"`
	OnCrash       string            `xml:"on_crash"`
	Devices       devicesXML        `xml:"devices"`
	SecLabels     []secLabelXML     `xml:"seclabel,omitempty"`
}

type metadataXML struct {
	VM vmMetaXML
}

type vmMetaXML struct {
	XMLName xml.Name `xml:"https://github.com/kvm-shim/containerd-shim-kvm-v1/metadata/v1 vm"`
	Metadata
}

type sizeXML struct {
	Unit  string `xml:"unit,attr"`
	Value int    `xml:",chardata"`
}

type vcpuXML struct {
	Placement string `xml:"placement,attr"`
	CPUSet    string `xml:"cpuset,attr,omitempty"`
	Current   int    `xml:"current,attr,omitempty"` // vCPUs online at start when below the maximum (the value)
	Value     int    `xml:",chardata"`
}

type memoryBackingXML struct {
	HugePages *hugePagesXML    `xml:"hugepages,omitempty"`
	Source    *memorySourceXML `xml:"source,omitempty"`
	Access    *memoryAccessXML `xml:"access,omitempty"`
}

type memorySourceXML struct {
	Type string `xml:"type,attr"`
}

type memoryAccessXML struct {
	Mode string `xml:"mode,attr"`
}

type hugePagesXML struct {
	Page pageXML `xml:"page"`
}

type pageXML struct {
	Size uint64 `xml:"size,attr"`
	Unit string `xml:"unit,attr"`
}

type cputuneXML struct {
	VCPUPins    []vcpuPinXML    `xml:"vcpupin"`
	EmulatorPin *emulatorPinXML `xml:"emulatorpin,omitempty"`
}

type vcpuPinXML struct {
	VCPU   int    `xml:"vcpu,attr"`
	CPUSet string `xml:"cpuset,attr"`
}

type emulatorPinXML struct {
	CPUSet string `xml:"cpuset,attr"`
}

type numatuneXML struct {
	Memory   numaMemoryXML `xml:"memory"`
	MemNodes []memNodeXML  `xml:"memnode"`
}

type numaMemoryXML struct {
	Mode    string `xml:"mode,attr"`
	Nodeset string `xml:"nodeset,attr"`
}

type memNodeXML struct {
	CellID  int    `xml:"cellid,attr"`
	Mode    string `xml:"mode,attr"`
	Nodeset string `xml:"nodeset,attr"`
}

type osXML struct {
	Type    osTypeXML `xml:"type"`
	Kernel  string    `xml:"kernel,omitempty"`
	Initrd  string    `xml:"initrd,omitempty"`
	Cmdline string    `xml:"cmdline,omitempty"`
	Boot    *bootXML  `xml:"boot,omitempty"`
	BIOS    *biosXML  `xml:"bios,omitempty"`
}

type biosXML struct {
	UseSerial string `xml:"useserial,attr"`
}

type osTypeXML struct {
	Arch    string `xml:"arch,attr"`
	Machine string `xml:"machine,attr,omitempty"`
	Value   string `xml:",chardata"`
}

type bootXML struct {
	Dev string `xml:"dev,attr"`
}

type featuresXML struct {
	ACPI *struct{} `xml:"acpi"`
	APIC *struct{} `xml:"apic"`
}

type cpuXML struct {
	Mode string      `xml:"mode,attr,omitempty"`
	NUMA *cpuNUMAXML `xml:"numa,omitempty"`
}

type cpuNUMAXML struct {
	Cells []cellXML `xml:"cell"`
}

type cellXML struct {
	ID     int    `xml:"id,attr"`
	CPUs   string `xml:"cpus,attr"`
	Memory int    `xml:"memory,attr"`
	Unit   string `xml:"unit,attr"`
}

type clockXML struct {
	Offset string `xml:"offset,attr"`
}

type devicesXML struct {
	Emulator    string            `xml:"emulator"`
	Disks       []diskXML         `xml:"disk"`
	Controllers []controllerXML   `xml:"controller"`
	Filesystems []filesystemXML   `xml:"filesystem"`
	Serials     []serialXML       `xml:"serial"`
	Channels    []channelXML      `xml:"channel"`
	RNGs        []rngXML          `xml:"rng"`
	Memories    []memoryDeviceXML `xml:"memory"`
	MemBalloon  *memBalloonXML    `xml:"memballoon,omitempty"`
}

type diskXML struct {
	Type     string        `xml:"type,attr"`
	Device   string        `xml:"device,attr"`
	Driver   diskDriverXML `xml:"driver"`
	Source   diskSourceXML `xml:"source"`
	Target   diskTargetXML `xml:"target"`
	Serial   string        `xml:"serial,omitempty"`
	ReadOnly *struct{}     `xml:"readonly,omitempty"`
}

type diskDriverXML struct {
	Name    string `xml:"name,attr"`
	Type    string `xml:"type,attr"`
	Cache   string `xml:"cache,attr,omitempty"`
	IO      string `xml:"io,attr,omitempty"`
	Discard string `xml:"discard,attr,omitempty"`
}

type diskSourceXML struct {
	File string `xml:"file,attr,omitempty"`
	Dev  string `xml:"dev,attr,omitempty"`
}

type diskTargetXML struct {
	Dev string `xml:"dev,attr"`
	Bus string `xml:"bus,attr"`
}

type controllerXML struct {
	Type  string `xml:"type,attr"`
	Index *int   `xml:"index,attr,omitempty"`
	Model string `xml:"model,attr,omitempty"`
	// Ports is a virtio-serial controller's number of ports.
	Ports int `xml:"ports,attr,omitempty"`
}

type serialXML struct {
	Type   string          `xml:"type,attr"`
	Source serialSourceXML `xml:"source"`
	Log    *serialLogXML   `xml:"log,omitempty"`
	Target serialTargetXML `xml:"target"`
}

type serialSourceXML struct {
	Mode string `xml:"mode,attr"`
	Path string `xml:"path,attr"`
}

type serialLogXML struct {
	File   string `xml:"file,attr"`
	Append string `xml:"append,attr"`
}

type serialTargetXML struct {
	Port int `xml:"port,attr"`
}

// channelXML is a virtio-serial port. With no path in its source, libvirt
// picks the socket's place itself (under its own state directory, out of
// the VM dir) and adds the virtio-serial controller the port needs.
type channelXML struct {
	Type   string           `xml:"type,attr"`
	Source channelSourceXML `xml:"source"`
	Target channelTargetXML `xml:"target"`
}

type channelSourceXML struct {
	Mode string `xml:"mode,attr"`
	Path string `xml:"path,attr,omitempty"`
}

type channelTargetXML struct {
	Type string `xml:"type,attr"`
	Name string `xml:"name,attr"`
}

type rngXML struct {
	Model   string        `xml:"model,attr"`
	Backend rngBackendXML `xml:"backend"`
}

type rngBackendXML struct {
	Model string `xml:"model,attr"`
	Value string `xml:",chardata"`
}

type memBalloonXML struct {
	Model string `xml:"model,attr"`
}

type filesystemXML struct {
	Type       string      `xml:"type,attr"`
	AccessMode string      `xml:"accessmode,attr"`
	Driver     fsDriverXML `xml:"driver"`
	Binary     fsBinaryXML `xml:"binary"`
	Source     fsSourceXML `xml:"source"`
	Target     fsTargetXML `xml:"target"`
}

type fsDriverXML struct {
	Type string `xml:"type,attr"`
}

type fsBinaryXML struct {
	Path string `xml:"path,attr"`
}

type fsSourceXML struct {
	Dir string `xml:"dir,attr"`
}

type fsTargetXML struct {
	Dir string `xml:"dir,attr"`
}
