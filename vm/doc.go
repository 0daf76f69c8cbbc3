// Package vm runs one virtual machine through libvirt: it turns a plain
// Spec into domain XML, drives the domain's lifecycle (define, start,
// ACPI power-off, destroy, suspend, undefine), watches its QEMU for the
// exit, reports state and statistics, and prepares the VM's disks from a
// container rootfs without touching the image inside it.
//
// The package knows nothing about containerd; callers pass plain structs.
package vm
