package vm

import "github.com/digitalocean/go-libvirt"

// EventKind is what an Event reports.
type EventKind int

const (
	// EventReconnected says the connection to libvirtd was lost and is
	// back. A domain may have changed meanwhile: re-read the state of every
	// domain.
	EventReconnected EventKind = iota + 1
)

// Event is news from a Conn.
type Event struct {
	Kind EventKind
}

// StopReason says why a domain stopped, from libvirt's shut-off state
// reasons.
type StopReason int

// The stop reasons.
const (
	StopUnknown   StopReason = iota // a reason libvirt did not give, or one not below
	StopShutdown                    // the guest powered off
	StopDestroyed                   // someone destroyed the domain
	StopCrashed                     // libvirt says crashed: QEMU ended without the guest's power-off
	StopFailed                      // QEMU died or failed to start
	StopOther                       // saved, migrated, restored from snapshot
	StopPanicked                    // the guest's kernel panicked (its panic device said so); the shim destroyed the domain
)

func (r StopReason) String() string {
	switch r {
	case StopShutdown:
		return "guest shutdown"
	case StopDestroyed:
		return "destroyed"
	case StopCrashed:
		return "QEMU ended without the guest's power-off (libvirt: crashed)"
	case StopFailed:
		return "emulator failed"
	case StopOther:
		return "saved or migrated"
	case StopPanicked:
		return "guest kernel panicked"
	}
	return "unknown"
}

// Exit statuses of a VM task, see the table in docs/lifecycle.md.
const (
	ExitPoweroff  = 0
	ExitDestroyed = 128 + 9 // like a process killed by SIGKILL
	ExitPanicked  = 250     // the guest's kernel panicked; not 128+n: no signal ended anything
	ExitFailed    = 255     // QEMU died or was killed outside the shim
)

// ExitStatus maps why a VM stopped to a task exit status. It is never 0
// unless the guest powered itself off (by itself or after an ACPI request).
//
// libvirt's shut-off reason "crashed" is QEMU ending without the guest's
// power-off: a QEMU killed or dead (libvirtd sees its monitor close with
// no shutdown first), or found gone by a libvirtd that comes back: 255. A
// guest kernel panic never reaches it: the domains' on_crash is preserve,
// so libvirt keeps QEMU, paused, in its state "crashed" (State.Panicked),
// and the shim, which sees that, destroys the domain and records
// StopPanicked. (With on_crash destroy libvirt 9.0 records a panic as the
// same shut-off "crashed" as a QEMU killed by SIGKILL.)
func (r StopReason) ExitStatus() uint32 {
	switch r {
	case StopShutdown:
		return ExitPoweroff
	case StopDestroyed:
		return ExitDestroyed
	case StopPanicked:
		return ExitPanicked
	}
	return ExitFailed
}

func stopReasonFromShutoff(r libvirt.DomainShutoffReason) StopReason {
	switch r {
	case libvirt.DomainShutoffShutdown:
		return StopShutdown
	case libvirt.DomainShutoffDestroyed:
		return StopDestroyed
	case libvirt.DomainShutoffCrashed:
		return StopCrashed
	case libvirt.DomainShutoffFailed, libvirt.DomainShutoffDaemon:
		return StopFailed
	case libvirt.DomainShutoffMigrated, libvirt.DomainShutoffSaved, libvirt.DomainShutoffFromSnapshot:
		return StopOther
	}
	return StopUnknown
}
