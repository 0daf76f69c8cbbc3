// Package netfd gives a VM the pod's network: it reads the pod network
// namespace (the CNI interface's MAC, MTU, addresses, routes and DNS),
// creates a multi-queue TAP with IFF_VNET_HDR inside that namespace, wires
// it to the CNI interface with tc mirred redirects (no bridge), opens
// vhost-net, and hands the file descriptors to the VM's QEMU over a unix
// socket with SCM_RIGHTS.
//
// All namespace work happens on a locked OS thread that is put back into
// the host namespace before it is released; a thread that cannot be put
// back is never reused. The package knows nothing about containerd.
package netfd
