// Package nodeinstall installs, upgrades and removes the shim on one
// Kubernetes node from the node installer's container (the host's root
// mounted in it): binaries renamed over their paths, the containerd
// runtime configuration for containerd 1.6/1.7 (config version 2) and 2.x
// (version 3), one containerd restart when that configuration changed and
// never otherwise, the shim's `check`, and the node label the kvm
// RuntimeClass schedules on. What it changed is recorded on the node, so
// removal puts containerd's configuration back byte for byte.
package nodeinstall
