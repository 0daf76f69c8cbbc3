//go:build !faultinject

package faultpoint

// Enabled tells whether this build can hold a task call: never in the shim
// that ships (see on.go).
const Enabled = false

// SetDir names the directory of the hold files; nothing here.
func SetDir(string) {}

// Hold would wait at p while its hold file exists; here it does nothing.
func Hold(Point) {}
