package micro

import (
	"testing"

	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

const vmDir = "/var/lib/containerd-shim-kvm-v1/vms/kvm-k8s-io-web-vm-0123456789ab"

// podSpec is what the shim renders for a CRI pod's VM container booted
// from a kernel: TCG, config drive, pod metadata, NUMA node placement.
func podSpec() vm.Spec {
	return vm.Spec{
		Name:      "kvm-prod-vm-0123456789ab",
		UUID:      "6f1c2a4e-8d3b-5e7f-9a0b-1c2d3e4f5a6b",
		VCPUs:     2,
		MemoryMiB: 2048,
		Accel:     vm.AccelTCG,
		Emulator:  "/usr/local/libexec/containerd-shim-kvm-v1/kvm-qemu-wrapper",
		Machine:   "q35",
		Kernel: &vm.Kernel{
			Path:    vmDir + "/vmlinuz",
			Initrd:  vmDir + "/initrd.img",
			Cmdline: "console=ttyS0 ip=10.88.0.5::10.88.0.1:255.255.255.0:web::off:10.96.0.10",
		},
		Console:     vm.Console{Socket: vmDir + "/console.sock", Log: vmDir + "/console.log"},
		ConfigDrive: &vm.ConfigDrive{Path: vmDir + "/config-2.img", Format: "vfat"},
		Meta: vm.Metadata{
			SandboxID: "5f2c0d1e9a", ContainerID: "c0ffee1234", Namespace: "k8s.io",
			PodUID: "0b6e8f4a-1111-2222-3333-444455556666", PodName: "web", PodNamespace: "prod",
			ContainerName: "vm", StateDir: vmDir,
			NUMA: `{"nodes":[0],"cpus":"0-15","mode":"node"}`,
		},
		Pinning: &vm.Pinning{CPUSet: seq(0, 16), EmulatorCPUs: seq(0, 16), MemoryNodes: []int{0}},
	}
}

// dedicatedDiskSpec is a larger KVM VM from a containerDisk with
// dedicated CPUs (one vcpupin per vCPU) and huge pages.
func dedicatedDiskSpec() vm.Spec {
	s := podSpec()
	s.Accel = vm.AccelKVM
	s.VCPUs = 16
	s.MemoryMiB = 32768
	s.Kernel = nil
	s.Disk = &vm.Disk{Path: vmDir + "/overlay.qcow2", Format: "qcow2"}
	pins := make([][]int, s.VCPUs)
	for i := range pins {
		pins[i] = []int{2 + i}
	}
	s.Pinning = &vm.Pinning{CPUSet: seq(2, 16), VCPUPins: pins, EmulatorCPUs: []int{0, 1}, MemoryNodes: []int{1}}
	s.HugePageKiB = 2048
	return s
}

func seq(from, n int) []int {
	v := make([]int, n)
	for i := range v {
		v[i] = from + i
	}
	return v
}

func benchmarkRender(b *testing.B, s vm.Spec) {
	if _, err := vm.Render(&s); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := vm.Render(&s); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRenderPodKernel renders a pod VM booted from a kernel (TCG).
func BenchmarkRenderPodKernel(b *testing.B) { benchmarkRender(b, podSpec()) }

// BenchmarkRenderDedicatedDisk renders a 16-vCPU dedicated-CPU disk VM (KVM).
func BenchmarkRenderDedicatedDisk(b *testing.B) { benchmarkRender(b, dedicatedDiskSpec()) }
