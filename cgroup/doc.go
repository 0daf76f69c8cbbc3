// Package cgroup puts a VM's QEMU into the cgroup its container was given
// (the OCI spec's linux.cgroupsPath, below the pod's cgroup that kubelet
// made), so the pod's limits, accounting and eviction see the VM. It
// creates the container's cgroup as runc would (missing parents too),
// moves a process with all its threads into it, reads its statistics and
// removes it again. It knows nothing of containerd or libvirt.
//
// Only the controllers that account a VM are used: memory, cpu, cpuacct
// and pids on cgroup v1; memory, cpu and pids on cgroup v2. On v1 the
// cpuset, devices and blkio hierarchies stay libvirt's, which keeps
// numatune's cpuset.mems and its device ACL. Which hierarchies exist is a
// host fact (Detect reads /proc/self/mountinfo once); tests pass fake trees.
package cgroup
