package procfs

import (
	"os"
	"os/exec"
	"testing"
)

func TestStartTimeAndGone(t *testing.T) {
	self, err := StartTime(os.Getpid())
	if err != nil || self == 0 {
		t.Fatalf("own start time: %d, %v", self, err)
	}
	if Gone(os.Getpid(), self) {
		t.Error("this process counts as gone")
	}
	if !Gone(os.Getpid(), self+1) {
		t.Error("a reused pid counts as the same process")
	}
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skip(err)
	}
	if !Gone(cmd.Process.Pid, 1) {
		t.Error("an exited process counts as alive")
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	if got := UnescapeMountinfo(`/run/a\040b`); got != "/run/a b" {
		t.Errorf("got %q", got)
	}
}
