// Package testenv runs private containerd daemons for benchmarks and
// end-to-end tests of the kvm shim: Debian's containerd 1.6 or the 2.x that
// hack/setup-host.sh builds, each with its own root, state, socket, CRI
// config, a bridge CNI network, a runc runtime and the kvm runtime. It
// imports image archives, runs that release's ctr against the daemon,
// speaks CRI as kubelet would, reads task status over containerd's API,
// and lists what a run left behind (shim processes, mounts, libvirt domains,
// pod IPs). It sets nothing up on the host beyond the daemon's own
// directory and the CNI bridge, and removes both on Stop.
package testenv
