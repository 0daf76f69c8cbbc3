// Package shim is the containerd task service of containerd-shim-kvm-v1
// (runtime io.containerd.kvm.v1): it maps task API calls onto VMs run by
// package vm. It is the only package that imports containerd API types,
// and it turns errors into gRPC codes once, at the ttrpc boundary.
//
// One shim serves one pod: the sandbox container is a bookkeeping task
// whose pid is the shim's own, and every other container of the pod is a
// libvirt domain.
package shim
