// Package check is the shim's `check` subcommand, the host preflight: it
// reports what the node has and lacks for running VM tasks (libvirt, the
// accelerator, QEMU and its tools, the TAP and vhost-net features, cgroups,
// NUMA, QEMU's confinement and the per-VM identities, the state dir, and
// whether containerd declares the runtime), each as ok, warn or FAIL. It
// reads the shim's configuration but stands apart from the task service,
// which never calls it.
package check
