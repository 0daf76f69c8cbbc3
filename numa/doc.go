// Package numa places VMs on the host's NUMA nodes and keeps the host's
// reservations consistent across the many shim processes of a node (one
// per pod). It knows nothing of containerd or libvirt: callers pass plain
// data and render the result into domain XML themselves.
//
// # Pieces
//
//   - ReadTopology parses the host's nodes, CPUs, memory and distances
//     from sysfs once; Topology is plain data, so tests feed fake trees.
//   - Place is the pure placement formula: (topology, policy, current
//     placements, request) → Placement or an error naming the numbers.
//   - Store runs Place under a cross-process file lock against a state
//     file, so concurrent shims never decide on the same state.
//   - Usage, Overlaps and Describe report what is held, for `check` and
//     tests: Describe(os.Stdout, topo, policy, snapshot) prints the
//     topology, each node's use and every reservation.
//
// # Modes
//
// A VM's Mode comes from a pod annotation, defaulting to the shim config.
//
// ModeNode (default): the VM's memory is bound to one node and its vCPUs
// float over that node's shared CPUs. A node qualifies when, with the VM
// added, floating vCPUs / shared CPUs ≤ Policy.CPUThreshold (default 4:
// CPU overcommit) and guest memory / MemTotal ≤ Policy.MemThreshold
// (default 1: no memory overcommit). Among qualifying nodes the one with
// the smallest |CPU ratio − memory ratio| after placement wins, then the
// lower CPU ratio + memory ratio, then the lower node ID. CPU ratio is
// (floating vCPUs + dedicated CPUs) / usable CPUs, so without dedicated
// VMs it is simply allocated vCPUs / node CPUs. Usable CPUs are the
// node's online CPUs minus Policy.ReservedCPUs; shared CPUs are usable
// CPUs no dedicated VM holds.
//
// ModeDedicated: each vCPU gets its own host CPU of one node (one vcpupin
// per vCPU), never given to another VM. CPUs are carved from the end of
// the node's usable list; the first Policy.MinSharedCPUs (default 1) usable
// CPUs of every node are never dedicated. They are the VM's EmulatorCPUs
// (emulatorpin), so emulator threads never land on another VM's dedicated
// CPUs either, and they keep node-mode VMs running. Dedicating CPUs
// shrinks the node's shared CPUs, so it is refused where the node's
// floating vCPUs would then exceed CPUThreshold over the CPUs left. The
// same balance formula chooses the node.
//
// ModeNone: no pinning. The VM is recorded (so `check` lists it) but
// counted on no node; hosts that mix it with the other modes should keep
// thresholds lower.
//
// # Dedicated CPUs and VMs already running
//
// A node-mode VM gets the node's shared CPUs at the time it is placed, and
// no VM placed after a dedicated one gets its CPUs. VMs are never re-pinned
// by this package: a node-mode VM placed before a dedicated one keeps a CPU
// set that includes the dedicated CPUs until someone re-pins it. Overlaps
// reports exactly these (Stale) cases; the shim may re-pin such a VM live
// to NodeUsage.SharedCPUs of its node (virDomainPinVcpuFlags and
// virDomainPinEmulator with the live flag). Released dedicated CPUs return
// to the shared set for VMs placed afterwards.
//
// # VMs larger than a node
//
// A VM that no single node could hold even empty is rejected with
// errdefs.ErrResourceExhausted ("VM x needs 64 GiB but the largest NUMA
// node has 32 GiB"), unless it is in node mode and Policy.AllowSpread is
// set. It is then split into near-equal shares over the fewest nodes k
// that have room for a share now: the best-balanced node first, then the
// nodes nearest to it (by distance), then by the formula. Each node holds
// one guest NUMA cell (Placement.GuestNodes): its vCPUs, its memory and
// the host CPUs they float over. A VM that fits one empty node is never
// spread, even when every node is too full for it now. Dedicated VMs are
// never spread.
//
// # Reservations across processes
//
// Store keeps every placement in one JSON state file. Each change holds an
// exclusive flock on path.lock while it reads the file, decides and
// replaces it by write-temporary, fsync, rename, fsync directory (the
// scheme of internal/nodestate, which hostid shares); a killed
// process loses the lock with its descriptors and leaves the old or the
// new file, never a torn one. The file carries per-node summaries and one
// reservation per line, so a Reserve decodes the summaries and copies the
// other lines instead of decoding every placement; Reconcile recomputes
// the summaries from the reservations. Each reservation records the process that
// made it (pid and start time). Store.Reconcile, run at shim start, keeps
// what libvirt's domains carry in their metadata plus reservations whose
// process still runs (another shim between Reserve and defining its
// domain) and drops the rest, so a crashed shim leaks nothing. The state
// describes running VMs of this boot: /run (a tmpfs) is the natural place
// for it and keeps the fsyncs cheap.
//
// # Rendering a placement (for the domain XML)
//
//   - node: <vcpu placement='static' cpuset='CPUs'>; <numatune><memory
//     mode='strict' nodeset='Nodes'/>.
//   - dedicated: as node, plus <cputune> with <vcpupin vcpu='i'
//     cpuset='VCPUPins[i]'/> per vCPU and <emulatorpin cpuset='EmulatorCPUs'/>.
//   - spread: <cpu><numa><cell id='i' cpus='GuestNodes[i].VCPUs'
//     memory='GuestNodes[i].MemoryMiB' unit='MiB'/>; <numatune><memory
//     mode='strict' nodeset='Nodes'/> plus <memnode cellid='i' mode='strict'
//     nodeset='GuestNodes[i].HostNode'/>; <vcpupin> of each vCPU to its
//     cell's CPUs.
//   - none: nothing.
//
// FormatCPUList turns CPU lists into libvirt's cpuset syntax.
package numa
