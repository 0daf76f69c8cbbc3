package vm

import "github.com/digitalocean/go-libvirt"

// EventKind is the part of a libvirt lifecycle event the shim acts on.
type EventKind int

const (
	// EventOther is any lifecycle event the shim does not act on.
	EventOther EventKind = iota
	// EventStarted: QEMU is up.
	EventStarted
	// EventSuspended: the guest's vCPUs are paused.
	EventSuspended
	// EventResumed: the guest's vCPUs run again.
	EventResumed
	// EventStopped: QEMU is gone; Reason says why.
	EventStopped
	// EventReconnected: the connection to libvirtd was lost and is back.
	// Events may have been missed: re-read the state of every domain.
	EventReconnected
)

// Event is a lifecycle event for one domain (or, for EventReconnected, for
// the connection).
type Event struct {
	Domain string
	Kind   EventKind
	Reason StopReason // with EventStopped
}

// StopReason says why a domain stopped, merged from libvirt's stopped-event
// details and shut-off state reasons, which number the same causes
// differently.
type StopReason int

const (
	StopUnknown   StopReason = iota
	StopShutdown             // the guest powered off
	StopDestroyed            // someone destroyed the domain
	StopCrashed              // the guest crashed (on_crash=destroy)
	StopFailed               // QEMU died or failed to start
	StopOther                // saved, migrated, restored from snapshot
)

func (r StopReason) String() string {
	switch r {
	case StopShutdown:
		return "guest shutdown"
	case StopDestroyed:
		return "destroyed"
	case StopCrashed:
		return "guest crashed"
	case StopFailed:
		return "emulator failed"
	case StopOther:
		return "saved or migrated"
	}
	return "unknown"
}

// Exit statuses of a VM task, see the README's table.
const (
	ExitPoweroff  = 0
	ExitDestroyed = 128 + 9 // like a process killed by SIGKILL
	ExitCrashed   = 128 + 6 // like SIGABRT: the guest kernel panicked
	ExitFailed    = 255     // QEMU died or was killed outside the shim
)

// ExitStatus maps why a VM stopped to a task exit status. It is never 0
// unless the guest powered itself off (by itself or after an ACPI request).
func (r StopReason) ExitStatus() uint32 {
	switch r {
	case StopShutdown:
		return ExitPoweroff
	case StopDestroyed:
		return ExitDestroyed
	case StopCrashed:
		return ExitCrashed
	}
	return ExitFailed
}

func eventFromLibvirt(m libvirt.DomainEventLifecycleMsg) Event {
	ev := Event{Domain: m.Dom.Name}
	switch libvirt.DomainEventType(m.Event) {
	case libvirt.DomainEventStarted:
		ev.Kind = EventStarted
	case libvirt.DomainEventSuspended:
		ev.Kind = EventSuspended
	case libvirt.DomainEventResumed:
		ev.Kind = EventResumed
	case libvirt.DomainEventStopped:
		ev.Kind = EventStopped
		ev.Reason = stopReasonFromEvent(libvirt.DomainEventStoppedDetailType(m.Detail))
	}
	return ev
}

func stopReasonFromEvent(d libvirt.DomainEventStoppedDetailType) StopReason {
	switch d {
	case libvirt.DomainEventStoppedShutdown:
		return StopShutdown
	case libvirt.DomainEventStoppedDestroyed:
		return StopDestroyed
	case libvirt.DomainEventStoppedCrashed:
		return StopCrashed
	case libvirt.DomainEventStoppedFailed:
		return StopFailed
	case libvirt.DomainEventStoppedMigrated, libvirt.DomainEventStoppedSaved, libvirt.DomainEventStoppedFromSnapshot:
		return StopOther
	}
	return StopUnknown
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
