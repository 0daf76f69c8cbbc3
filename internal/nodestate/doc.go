// Package nodestate keeps a node-wide state file that every shim process
// on the node shares, as the NUMA reservations and the per-VM host
// identities are kept. Each change takes an exclusive flock on a lock file
// beside the state (path + ".lock", never replaced, so the lock and the
// data cannot drift apart), reads the state, decides, and replaces it
// through path + ".tmp" with a rename: readers see the old state or the
// new one, never a torn file, and a process killed while it holds the
// lock loses it with its descriptors. On a disk the write is synced with
// its directory (a change that a power loss undid could hand one resource
// to two VMs after the reboot); on a tmpfs there is nothing to sync.
//
// What a live process took but libvirt does not know yet is marked with
// its Holder, so that a reconcile keeps it while that process runs and
// frees it once it is gone.
package nodestate
