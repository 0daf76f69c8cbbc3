// Package faultpoint names the points of the shim's task calls where a
// fault test can hold the shim, so that it can kill a component while a
// call is in flight, deterministically; and holds there in the build made
// for those tests (go build -tags faultinject), never in the shim that
// ships.
//
// The shim calls Hold at each point explicitly; the integration tests
// import the same constants to make the hold files. While
// <state dir>/hold-<point> exists the shim waits at the point, and it shows
// that it does by <state dir>/held-<point> (holding its pid).
package faultpoint

import "path/filepath"

// Point is one place in Create, Start, Kill or Delete.
type Point string

// The points, in the order a VM meets them. Each is named for what is
// done when the shim waits there.
const (
	// Defined: Create, once the domain is defined, before the config
	// drive is waited for and the task is answered.
	Defined Point = "define"
	// LibvirtCreated: Start, once libvirt started QEMU with its vCPUs
	// paused, before the console is attached and the vCPUs run.
	LibvirtCreated Point = "libvirt_create"
	// Stopping: Kill with SIGTERM, before the ACPI power button is pressed.
	Stopping Point = "stopping"
	// ReleaseUndefine: Delete, before the domain is undefined (QEMU is
	// gone), with the VM's files and reservations still in place.
	ReleaseUndefine Point = "release_undefine"
)

// HoldFile is the file whose existence holds the shim at p.
func HoldFile(stateDir string, p Point) string {
	return filepath.Join(stateDir, "hold-"+string(p))
}

// HeldFile is the file the shim writes (its pid) while it waits at p.
func HeldFile(stateDir string, p Point) string {
	return filepath.Join(stateDir, "held-"+string(p))
}
