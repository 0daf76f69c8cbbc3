package vm

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func baseSpec() Spec {
	return Spec{
		Name:      "kvm-default-vm1-0123456789ab",
		UUID:      "6f1c2a4e-8d3b-5e7f-9a0b-1c2d3e4f5a6b",
		VCPUs:     2,
		MemoryMiB: 512,
		Accel:     AccelTCG,
		Emulator:  "/usr/bin/qemu-system-x86_64",
		Machine:   "q35",
		Console: Console{
			Socket: "/var/lib/containerd-shim-kvm-v1/vms/kvm-default-vm1-0123456789ab/console.sock",
			Log:    "/var/lib/containerd-shim-kvm-v1/vms/kvm-default-vm1-0123456789ab/console.log",
		},
		Meta: Metadata{
			ContainerID: "vm1",
			Namespace:   "default",
			StateDir:    "/var/lib/containerd-shim-kvm-v1/vms/kvm-default-vm1-0123456789ab",
		},
	}
}

func goldenCases() map[string]Spec {
	tcgDisk := baseSpec()
	tcgDisk.Disk = &Disk{Path: "/var/lib/containerd-shim-kvm-v1/vms/kvm-default-vm1-0123456789ab/overlay.qcow2", Format: "qcow2"}
	// The shim's VMs run under an identity of their own.
	tcgDisk.Identity = &Identity{UID: 1000000007, GID: 1000000007}

	kvmKernel := baseSpec()
	kvmKernel.Accel = AccelKVM
	kvmKernel.VCPUs = 4
	kvmKernel.Kernel = &Kernel{
		Path:    "/var/lib/containerd-shim-kvm-v1/vms/x/vmlinuz",
		Initrd:  "/var/lib/containerd-shim-kvm-v1/vms/x/initrd.img",
		Cmdline: "console=ttyS0 quiet",
	}
	kvmKernel.Meta = Metadata{
		SandboxID:     "sb1",
		ContainerID:   "c1",
		Namespace:     "k8s.io",
		PodUID:        "uid-1",
		PodName:       "web",
		PodNamespace:  "prod",
		ContainerName: "vm",
		StateDir:      "/var/lib/containerd-shim-kvm-v1/pods/uid-1/vm",
	}

	// Hostile strings must come out escaped, never as markup.
	hostile := baseSpec()
	hostile.Kernel = &Kernel{Path: "/k", Cmdline: `console=ttyS0 x="</cmdline><devices>" & y='1'`}
	hostile.Meta.PodName = "</vm><evil/>"

	node := baseSpec()
	node.Disk = tcgDisk.Disk
	node.Pinning = &Pinning{CPUSet: []int{8, 9, 10, 11, 13}, MemoryNodes: []int{1}}

	dedicated := baseSpec()
	dedicated.Accel = AccelKVM
	dedicated.Disk = tcgDisk.Disk
	dedicated.HugePageKiB = 2048
	dedicated.Pinning = &Pinning{CPUSet: []int{14, 15}, VCPUPins: [][]int{{15}, {14}}, EmulatorCPUs: []int{8}, MemoryNodes: []int{1}}

	spread := baseSpec()
	spread.VCPUs = 4
	spread.MemoryMiB = 2048
	spread.Disk = tcgDisk.Disk
	spread.Pinning = &Pinning{CPUSet: []int{0, 1, 2, 3, 4, 5, 6, 7}, MemoryNodes: []int{0, 1},
		VCPUPins: [][]int{{0, 1, 2, 3}, {0, 1, 2, 3}, {4, 5, 6, 7}, {4, 5, 6, 7}}, Cells: []Cell{
			{HostNode: 0, VCPUs: []int{0, 1}, MemoryMiB: 1024},
			{HostNode: 1, VCPUs: []int{2, 3}, MemoryMiB: 1024},
		}}

	// Starts with 1 vCPU of up to 4, floating over a node's CPUs.
	hotplug := node
	hotplug.MaxVCPUs = 4

	vfat := baseSpec()
	vfat.Disk = tcgDisk.Disk
	vfat.ConfigDrive = &ConfigDrive{Path: "/var/lib/containerd-shim-kvm-v1/vms/x/config-2.img", Format: "vfat"}
	iso := baseSpec()
	iso.Kernel = &Kernel{Path: "/k"}
	iso.ConfigDrive = &ConfigDrive{Path: "/var/lib/containerd-shim-kvm-v1/vms/x/config-2.iso", Format: "iso9660"}

	// Every volume kind; the same volumes with huge pages and guest NUMA
	// cells (shares then need only shared access to the huge pages).
	volumes := baseSpec()
	volumes.Kernel = &Kernel{Path: "/k"}
	volumes.VolumeDisks = []VolumeDisk{
		{Name: "/dev/xvda", Path: "/dev/loop7", Block: true, Format: "raw", Serial: "dev-xvda"},
		{Name: "/dev/xvdb", Path: "/dev/sdc", Block: true, Format: "raw", Serial: "dev-xvdb", ReadOnly: true},
		{Name: "/data", Path: "/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/pvc-1/mount/disk.img", Format: "qcow2", Serial: "data"},
		{Name: "/scratch", Path: "/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~empty-dir/s/disk.img", Format: "raw", Serial: "scratch",
			HostCache: true},
	}
	volumes.VirtiofsBinary = "/usr/lib/qemu/virtiofsd"
	volumes.Identity = &Identity{UID: 1000065535, GID: 1000065535}
	volumes.Shares = []Share{
		{Name: "/etc/app", Source: "/var/lib/containerd-shim-kvm-v1/vms/x/shares/0", Tag: "etc-app"},
		{Name: "/cache", Source: "/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~empty-dir/cache", Tag: "cache"},
	}
	volumesNUMA := spread
	volumesNUMA.HugePageKiB = 2048
	volumesNUMA.VolumeDisks = volumes.VolumeDisks[:1]
	volumesNUMA.Shares = volumes.Shares
	volumesNUMA.VirtiofsBinary = volumes.VirtiofsBinary

	volumesCells := volumesNUMA
	volumesCells.HugePageKiB = 0

	// Memory hot-add (virtio-mem): with vCPU hotplug on a node; on KVM
	// with huge pages and strict NUMA; with virtiofs shares (memfd).
	memHotplug := hotplug
	memHotplug.MaxMemoryMiB = 2048
	memKVM := dedicated
	memKVM.Pinning = node.Pinning
	memKVM.MaxMemoryMiB = 1536
	memShares := volumes
	memShares.MaxMemoryMiB = 1024

	return map[string]Spec{
		"hotplug-memory": memHotplug, "hotplug-memory-kvm-hugepages": memKVM, "hotplug-memory-shares": memShares,
		"volumes": volumes, "volumes-hugepages-numa": volumesNUMA, "volumes-numa-memfd": volumesCells,
		"configdrive-vfat": vfat, "configdrive-iso": iso,
		"tcg-disk": tcgDisk, "kvm-kernel": kvmKernel, "escaping": hostile,
		"numa-node": node, "numa-dedicated": dedicated, "numa-spread": spread,
		"hotplug-vcpus": hotplug,
	}
}

func TestRenderGolden(t *testing.T) {
	for name, spec := range goldenCases() {
		t.Run(name, func(t *testing.T) {
			got, err := Render(&spec)
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", name+".xml")
			if *update {
				if err = os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./vm -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("rendered XML differs from %s:\n%s", golden, got)
			}
		})
	}
}

// TestRenderEscapes parses the hostile case back: the values must survive
// the round trip and no element may have been injected.
func TestRenderEscapes(t *testing.T) {
	spec := goldenCases()["escaping"]
	out, err := Render(&spec)
	if err != nil {
		t.Fatal(err)
	}
	var back libvirtxml.Domain
	if err := back.Unmarshal(string(out)); err != nil {
		t.Fatal(err)
	}
	if back.OS.Cmdline != spec.Kernel.Cmdline {
		t.Errorf("cmdline round trip: got %q", back.OS.Cmdline)
	}
	if strings.Contains(string(out), "<evil") || strings.Contains(string(out), "<devices>\"") {
		t.Errorf("markup injected:\n%s", out)
	}
}

// TestRenderValidates checks every golden case against libvirt's own schema.
func TestRenderValidates(t *testing.T) {
	validator, err := exec.LookPath("virt-xml-validate")
	if err != nil {
		t.Skip("virt-xml-validate not installed (package libvirt-clients)")
	}
	if _, err := exec.LookPath("xmllint"); err != nil {
		t.Skip("xmllint, which virt-xml-validate runs, not installed (package libxml2-utils)")
	}
	for name, spec := range goldenCases() {
		out, err := Render(&spec)
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(t.TempDir(), name+".xml")
		if err := os.WriteFile(f, out, 0o644); err != nil {
			t.Fatal(err)
		}
		if msg, err := exec.Command(validator, f, "domain").CombinedOutput(); err != nil {
			t.Errorf("%s does not validate: %v\n%s", name, err, msg)
		}
	}
}

func TestValidateRejects(t *testing.T) {
	cases := map[string]func(*Spec){
		"no boot source":   func(s *Spec) {},
		"two boot sources": func(s *Spec) { s.Disk = &Disk{Path: "/d", Format: "raw"}; s.Kernel = &Kernel{Path: "/k"} },
		"zero vcpus":       func(s *Spec) { s.Disk = &Disk{Path: "/d", Format: "raw"}; s.VCPUs = 0 },
		"bad uuid":         func(s *Spec) { s.Disk = &Disk{Path: "/d", Format: "raw"}; s.UUID = "x" },
		"bad format":       func(s *Spec) { s.Disk = &Disk{Path: "/d", Format: "vmdk"} },
		"bad accel":        func(s *Spec) { s.Disk = &Disk{Path: "/d", Format: "raw"}; s.Accel = "hvf" },
		"newline in name":  func(s *Spec) { s.Disk = &Disk{Path: "/d", Format: "raw"}; s.Name = "a\nb" },
		"return in a path": func(s *Spec) { s.Disk = &Disk{Path: "/\r", Format: "raw"} },
		"bad drive format": func(s *Spec) {
			s.Disk = &Disk{Path: "/d", Format: "raw"}
			s.ConfigDrive = &ConfigDrive{Path: "/c", Format: "ext4"}
		},
		"pins for 1 of 2": func(s *Spec) { s.Disk = &Disk{Path: "/d", Format: "raw"}; s.Pinning = &Pinning{VCPUPins: [][]int{{3}}} },
		"max below vcpus": func(s *Spec) { s.Disk = &Disk{Path: "/d", Format: "raw"}; s.VCPUs = 2; s.MaxVCPUs = 1 },
		"pinned hotplug": func(s *Spec) {
			s.Disk = &Disk{Path: "/d", Format: "raw"}
			s.Pinning = &Pinning{VCPUPins: [][]int{{3}}}
			s.MaxVCPUs = 2
		},
		"block qcow2": func(s *Spec) {
			s.Kernel = &Kernel{Path: "/k"}
			s.VolumeDisks = []VolumeDisk{{Name: "/v", Path: "/dev/sdb", Block: true, Format: "qcow2", Serial: "v"}}
		},
		"serial too long": func(s *Spec) {
			s.Kernel = &Kernel{Path: "/k"}
			s.VolumeDisks = []VolumeDisk{{Name: "/v", Path: "/dev/sdb", Block: true, Format: "raw", Serial: "abcdefghijklmnopqrstu"}}
		},
		"serial with a space": func(s *Spec) {
			s.Kernel = &Kernel{Path: "/k"}
			s.VolumeDisks = []VolumeDisk{{Name: "/v", Path: "/dev/sdb", Block: true, Format: "raw", Serial: "a b"}}
		},
		"same serial twice": func(s *Spec) {
			s.Kernel = &Kernel{Path: "/k"}
			d := VolumeDisk{Name: "/v", Path: "/dev/sdb", Block: true, Format: "raw", Serial: "v"}
			s.VolumeDisks = []VolumeDisk{d, d}
		},
		"too many disks": func(s *Spec) {
			s.Kernel = &Kernel{Path: "/k"}
			for i := 0; i <= MaxVolumeDisks; i++ {
				s.VolumeDisks = append(s.VolumeDisks, VolumeDisk{Name: "/v", Path: "/d", Format: "raw", Serial: fmt.Sprint("s", i)})
			}
		},
		"too many shares": func(s *Spec) {
			s.Kernel = &Kernel{Path: "/k"}
			s.VirtiofsBinary = "/v"
			for i := 0; i <= MaxShares; i++ {
				s.Shares = append(s.Shares, Share{Name: "/v", Source: "/s", Tag: fmt.Sprint("t", i)})
			}
		},
		"share without virtiofsd": func(s *Spec) {
			s.Kernel = &Kernel{Path: "/k"}
			s.Shares = []Share{{Name: "/v", Source: "/s", Tag: "t"}}
		},
		"tag too long": func(s *Spec) {
			s.Kernel = &Kernel{Path: "/k"}
			s.VirtiofsBinary = "/v"
			s.Shares = []Share{{Name: "/v", Source: "/s", Tag: strings.Repeat("t", MaxTagLen+1)}}
		},
	}
	for name, mutate := range cases {
		s := baseSpec()
		mutate(&s)
		if _, err := Render(&s); err == nil {
			t.Errorf("%s: rendered without error", name)
		}
	}
}

func TestCPUList(t *testing.T) {
	for in, want := range map[string]string{"": "", "3": "3", "0 1 2 3": "0-3", "8 0 1 3 10 11": "0-1,3,8,10-11"} {
		var v []int
		for _, f := range strings.Fields(in) {
			n := 0
			if _, err := fmt.Sscan(f, &n); err != nil {
				t.Fatal(err)
			}
			v = append(v, n)
		}
		if got := cpuList(v); got != want {
			t.Errorf("cpuList(%v) = %q, want %q", v, got, want)
		}
	}
}

// Every domain has the one panic device a guest kernel reports a panic
// through, and keeps QEMU when it does (on_crash preserve), so that the
// shim sees libvirt's "crashed" state and not a QEMU just gone; the
// reboot keeps the same QEMU.
func TestRenderPanicDevice(t *testing.T) {
	for name, spec := range goldenCases() {
		out, err := Render(&spec)
		if err != nil {
			t.Fatal(err)
		}
		var d libvirtxml.Domain
		if err := d.Unmarshal(string(out)); err != nil {
			t.Fatal(err)
		}
		if len(d.Devices.Panics) != 1 || d.Devices.Panics[0].Model != "isa" {
			t.Errorf("%s: panic devices %+v, want one of model isa", name, d.Devices.Panics)
		}
		if d.OnCrash != "preserve" || d.OnReboot != "restart" || d.OnPoweroff != "destroy" {
			t.Errorf("%s: on_poweroff %s on_reboot %s on_crash %s, want destroy, restart, preserve", name, d.OnPoweroff, d.OnReboot, d.OnCrash)
		}
	}
}
