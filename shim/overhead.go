package shim

// PodFixedOverheadMiB is the memory a VM's pod needs above the guest's RAM
// (QEMU itself, its page tables, kernel memory, the page cache of what it
// reads): the RuntimeClass overhead.podFixed memory to declare, so that a
// guest using all of its RAM stays within the pod's limit. Measured on
// this project's test machine under TCG by `kvmbench -sections resources`
// (docs/resources.md, "Overhead and RuntimeClass"): the largest overhead seen with
// every guest page touched, plus a quarter, rounded up to 16 MiB. A host
// with KVM needs less (no TCG translation cache).
const PodFixedOverheadMiB = 144
