// Package vmplan is the pure translation from a container's OCI spec and
// the shim's config to the settings of its VM: size, name and uuid, the
// volumes the spec asks for, NUMA mode and huge pages, how far the VM may
// grow live, and what a resize asks. It does no I/O (TestNoIO holds it to
// that), so every function here is fuzzable without fixtures; looking at
// the host and creating things is the shim's.
package vmplan
