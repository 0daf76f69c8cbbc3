// Package hostid gives each VM a host identity of its own: a uid, with
// the gid of the same number, from a configured range, so that nothing
// but root and the VM's own QEMU can reach the VM's files, and one VM's
// QEMU can reach nothing of another's. The identity goes into the
// domain as libvirt's static DAC label (see vm.Identity); libvirt then
// runs that VM's QEMU under it and gives the VM's disks to it.
//
// The allocations of every shim of the node live in one JSON state file,
// changed under an exclusive flock on path.lock, written to a temporary
// file, fsynced and renamed over the state (internal/nodestate, which
// numa.Store uses too), so a
// killed shim leaves the old state or the new one and loses its lock
// with its descriptors. Each allocation records the process that made it
// (pid and start time) until libvirt's domains vouch for it:
// Store.ReconcileWith, run when a shim connects to libvirt, keeps the
// identities the domains' seclabels carry plus those whose allocating
// process still runs (a shim between Allocate and defining its domain)
// and frees the rest, so a crashed shim leaks none.
//
// Allocation goes round the range: the next identity handed out is the
// first free one after the last handed out, so a freed uid is reused only
// after every other free one in the range was, never while its VM lives.
package hostid
