package testenv

import specs "github.com/opencontainers/runtime-spec/specs-go"

// CRISpec is the part of an OCI spec CRI writes for a container with
// volumes: kernel file systems, its own plumbing bind mounts, and the
// volumes' bind mounts and devices. The unit tests of the spec's
// translation (vmplan) and of the shim's volumes start from it.
func CRISpec(volumes []specs.Mount, devices []specs.LinuxDevice) *specs.Spec {
	bind := func(dst string) specs.Mount {
		return specs.Mount{Destination: dst, Type: "bind", Source: "/var/lib/containerd/sandboxes/x" + dst,
			Options: []string{"rbind", "rprivate", "rw"}}
	}
	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs"},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts"},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue"},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs"},
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup"},
		bind("/etc/hosts"), bind("/etc/hostname"), bind("/etc/resolv.conf"), bind("/dev/shm"), bind("/dev/termination-log"),
	}
	var rules []specs.LinuxDeviceCgroup
	for _, d := range devices {
		major, minor := d.Major, d.Minor
		rules = append(rules, specs.LinuxDeviceCgroup{Allow: true, Type: d.Type, Major: &major, Minor: &minor, Access: "rwm"})
	}
	return &specs.Spec{
		Mounts: append(mounts, volumes...),
		Linux:  &specs.Linux{Devices: devices, Resources: &specs.LinuxResources{Devices: rules}},
	}
}
