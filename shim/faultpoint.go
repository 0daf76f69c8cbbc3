//go:build !faultinject

package shim

// faultInjection tells whether this build can hold a step for a fault
// test: never in the shim that ships (see faultpoint_inject.go).
const faultInjection = false

// faultPoint marks a point of Create, Start, Kill or Delete where the
// fault-injection build can hold the shim; here it does nothing.
func faultPoint(string) {}

// setFaultDir names the directory of the hold files; nothing here.
func setFaultDir(string) {}
