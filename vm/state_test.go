package vm

import (
	"testing"

	"github.com/digitalocean/go-libvirt"
)

// libvirt's state "crashed" is a guest that panicked, held by QEMU (the
// domains' on_crash is preserve): running to the shim, panicked; its
// shut-off reasons map to the stop reasons and their exit statuses.
func TestStateOf(t *testing.T) {
	cases := []struct {
		st     libvirt.DomainState
		reason int32
		want   State
		exit   uint32
	}{
		{libvirt.DomainRunning, 1, State{Running: true}, 0},
		{libvirt.DomainPaused, 1, State{Running: true, Paused: true}, 0},
		{libvirt.DomainCrashed, int32(libvirt.DomainCrashedPanicked), State{Running: true, Panicked: true}, 0},
		{libvirt.DomainShutoff, int32(libvirt.DomainShutoffShutdown), State{Reason: StopShutdown}, ExitPoweroff},
		{libvirt.DomainShutoff, int32(libvirt.DomainShutoffDestroyed), State{Reason: StopDestroyed}, ExitDestroyed},
		{libvirt.DomainShutoff, int32(libvirt.DomainShutoffCrashed), State{Reason: StopCrashed}, ExitFailed},
		{libvirt.DomainShutoff, int32(libvirt.DomainShutoffFailed), State{Reason: StopFailed}, ExitFailed},
	}
	for _, tc := range cases {
		got := stateOf(tc.st, tc.reason)
		if got != tc.want {
			t.Errorf("state %d reason %d: %+v, want %+v", tc.st, tc.reason, got, tc.want)
		}
		if !got.Running && got.Reason.ExitStatus() != tc.exit {
			t.Errorf("state %d reason %d: exit %d, want %d", tc.st, tc.reason, got.Reason.ExitStatus(), tc.exit)
		}
	}
	if StopPanicked.ExitStatus() != ExitPanicked || ExitPanicked == ExitFailed {
		t.Errorf("a panic exits %d, want its own %d", StopPanicked.ExitStatus(), ExitPanicked)
	}
}
