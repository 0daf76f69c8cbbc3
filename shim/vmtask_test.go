package shim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/runtime"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
	"github.com/kvm-shim/containerd-shim-kvm-v1/config"
	"github.com/kvm-shim/containerd-shim-kvm-v1/configdrive"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vmplan"
)

type eventLog struct {
	mu     sync.Mutex
	events []any
}

func (l *eventLog) publish(e any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

func (l *eventLog) exits() []*eventstypes.TaskExit {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*eventstypes.TaskExit
	for _, e := range l.events {
		if x, ok := e.(*eventstypes.TaskExit); ok {
			out = append(out, x)
		}
	}
	return out
}

type vmFixture struct {
	t      *testing.T
	fake   *fakeDomains
	host   *host
	events *eventLog
	bundle string
	// cgroupsPath is the spec's linux.cgroupsPath ("" for no Linux section).
	cgroupsPath string
	stdio       stdio  // the task's
	id          string // the container's id; "" is vm1
	netns       string // the pod's network namespace given to Create; "" for none
}

func newVMFixture(t *testing.T) *vmFixture {
	state := t.TempDir()
	cfg := config.Default()
	cfg.StateDir = state
	cfg.VMIDRange, cfg.VMIDStateFile = testIDRange, filepath.Join(state, "ids.json")
	ids, err := openIDs(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &vmFixture{
		t:      t,
		fake:   newFakeDomains(),
		host:   &host{cfg: cfg, accel: vm.AccelTCG, layout: layout{root: state}, ids: ids},
		events: &eventLog{},
		bundle: t.TempDir(),
	}
}

// kernelRootfs writes a direct-boot image's files into the bundle's rootfs.
func (f *vmFixture) kernelRootfs() {
	for _, p := range []string{"boot/vmlinuz", "boot/initrd.img"} {
		full := filepath.Join(f.bundle, "rootfs", p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			f.t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(p), 0o644); err != nil {
			f.t.Fatal(err)
		}
	}
}

func (f *vmFixture) create(ann map[string]string) (*vmTask, error) {
	return f.createSpec(&specs.Spec{Annotations: ann})
}

func (f *vmFixture) createSpec(spec *specs.Spec) (*vmTask, error) {
	f.host.conn = f.fake
	if f.cgroupsPath != "" {
		if spec.Linux == nil {
			spec.Linux = &specs.Linux{}
		}
		spec.Linux.CgroupsPath = f.cgroupsPath
	}
	if spec.Annotations == nil {
		spec.Annotations = map[string]string{}
	}
	id := f.id
	if id == "" {
		id = "vm1"
	}
	ident := vmplan.Identity{Namespace: "default", ContainerID: id}
	req := createRequest{id: id, bundle: f.bundle, spec: spec, stdio: f.stdio, netns: f.netns}
	vt, err := createVMTask(context.Background(), f.host, req, ident, f.events.publish)
	if err == nil {
		// Tests that never delete the task must not leave bind mounts
		// under their temp dirs.
		f.t.Cleanup(func() {
			for _, m := range readOnlyMounts(vt.rec.VMDir) {
				_ = vm.Unmount(m)
			}
		})
	}
	return vt, err
}

// created is a direct-boot VM task, created and not started.
func (f *vmFixture) created() *vmTask {
	f.kernelRootfs()
	vt, err := f.create(nil)
	if err != nil {
		f.t.Fatal(err)
	}
	return vt
}

func (f *vmFixture) started() *vmTask {
	vt := f.created()
	if _, err := vt.start(context.Background()); err != nil {
		f.t.Fatal(err)
	}
	return vt
}

func waitExit(t *testing.T, vt *vmTask) uint32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, _, err := vt.wait(ctx)
	if err != nil {
		t.Fatalf("no exit: %v", err)
	}
	return st
}

func TestVMTaskExitStatus(t *testing.T) {
	cases := []struct {
		name   string
		signal unix.Signal
		call   string
		reason vm.StopReason
		want   uint32
		away   bool // libvirtd restarted after the kill
	}{
		{"SIGTERM powers off", unix.SIGTERM, "shutdown", vm.StopShutdown, 0, false},
		{"SIGINT powers off", unix.SIGINT, "shutdown", vm.StopShutdown, 0, false},
		{"SIGKILL destroys", unix.SIGKILL, "destroy", vm.StopDestroyed, 137, false},
		{"QEMU dies", 0, "", vm.StopFailed, 255, false},
		{"libvirt says crashed (QEMU gone)", 0, "", vm.StopCrashed, 255, false},
		{"crashed after away, no press", 0, "", vm.StopCrashed, 255, true},
		// libvirtd restarted while the guest powered off: libvirt finds
		// it powered off (or QEMU gone) and calls it crashed.
		{"SIGTERM, away, crashed", unix.SIGTERM, "shutdown", vm.StopCrashed, 0, true},
		// libvirtd there all along: "crashed" after the press is QEMU
		// killed or dead before the guest finished powering off.
		{"SIGTERM, crashed, not away", unix.SIGTERM, "shutdown", vm.StopCrashed, 255, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newVMFixture(t)
			vt := f.started()
			if status, pid, _, _ := vt.snapshot(); status != task.Status_RUNNING || pid != 4242 {
				t.Fatalf("after start: %s pid %d", status, pid)
			}
			if tc.signal != 0 {
				if err := vt.kill(context.Background(), uint32(tc.signal)); err != nil {
					t.Fatal(err)
				}
				if calls := f.fake.called(); calls[len(calls)-1] != tc.call+" "+vt.rec.Domain {
					t.Fatalf("kill made calls %v, want %s last", calls, tc.call)
				}
			}
			if tc.away {
				f.fake.reconnected()
			}
			// The stop as libvirt reports it, here through onStopped
			// (a resync's path); QEMU's watch stays silent: the
			// mapping of the watch's own reads is tested below.
			f.fake.stopUnwatched(vt.rec.Domain, tc.reason)
			vt.onStopped(context.Background(), tc.reason)
			if got := waitExit(t, vt); got != tc.want {
				t.Errorf("exit status %d, want %d", got, tc.want)
			}
			exits := f.events.exits()
			if len(exits) != 1 || exits[0].ExitStatus != tc.want || exits[0].Pid != 4242 {
				t.Errorf("exit events %v", exits)
			}
			// A second stop notice (event and resync both) publishes nothing more.
			vt.onStopped(context.Background(), tc.reason)
			if len(f.events.exits()) != 1 {
				t.Error("exit published twice")
			}
			if err := vt.kill(context.Background(), uint32(unix.SIGKILL)); !errdefs.IsNotFound(err) {
				t.Errorf("kill after exit: %v, want NotFound", err)
			}
		})
	}
}

// A guest that stops the moment its vCPUs run: the stop notice comes
// while Start is still at work, and containerd must see the task start
// before it sees it exit.
func TestVMTaskStartPublishedBeforeImmediateExit(t *testing.T) {
	f := newVMFixture(t)
	vt := f.created()
	noticed := make(chan struct{})
	f.fake.resumed = func(name string) {
		f.fake.stop(name, vm.StopShutdown)
		go func() {
			defer close(noticed)
			vt.onStopped(context.Background(), vm.StopShutdown)
		}()
	}
	if _, err := vt.start(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-noticed
	f.events.mu.Lock()
	defer f.events.mu.Unlock()
	var order []string
	for _, e := range f.events.events {
		order = append(order, topic(e))
	}
	if len(order) != 2 || order[0] != runtime.TaskStartEventTopic || order[1] != runtime.TaskExitEventTopic {
		t.Errorf("events %v, want TaskStart then TaskExit", order)
	}
}

// A Wait that returns finds the TaskExit queued: a Delete that follows
// the Wait cannot publish its TaskDelete first.
func TestVMTaskExitQueuedBeforeWaitReturns(t *testing.T) {
	f := newVMFixture(t)
	vt := f.started()
	queued := make(chan int, 1)
	go func() {
		_, _, _ = vt.wait(context.Background())
		queued <- len(f.events.exits())
	}()
	f.fake.stop(vt.rec.Domain, vm.StopShutdown)
	vt.onStopped(context.Background(), vm.StopShutdown)
	if n := <-queued; n != 1 {
		t.Errorf("Wait returned with %d TaskExit queued, want 1", n)
	}
}

// SIGTERM presses the power button, which a paused guest cannot answer
// (libvirt refuses): as a signal to a frozen container, the press waits
// for the resume. SIGKILL still destroys a paused VM at once.
func TestVMTaskKillPaused(t *testing.T) {
	f := newVMFixture(t)
	vt := f.started()
	ctx := context.Background()
	if err := vt.pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := vt.kill(ctx, uint32(unix.SIGTERM)); err != nil {
		t.Errorf("SIGTERM while paused: %v", err)
	}
	calls := f.fake.called()
	if last := calls[len(calls)-1]; last != "suspend "+vt.rec.Domain {
		t.Errorf("SIGTERM while paused called %q", last)
	}
	if status, _, _, _ := vt.snapshot(); status != task.Status_PAUSED {
		t.Errorf("after SIGTERM: %s, want PAUSED", status)
	}
	if err := vt.resume(ctx); err != nil {
		t.Fatal(err)
	}
	calls = f.fake.called()
	if got := strings.Join(calls[len(calls)-2:], ", "); got != "resume "+vt.rec.Domain+", shutdown "+vt.rec.Domain {
		t.Errorf("resume made calls %q, want the resume, then the power button", got)
	}
	if err := vt.pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := vt.kill(ctx, uint32(unix.SIGKILL)); err != nil {
		t.Errorf("SIGKILL while paused: %v", err)
	}
}

// A Pause between kill's check and the power button: the press waits for
// the resume, as when the VM was paused before.
func TestVMTaskKillRacingPause(t *testing.T) {
	f := newVMFixture(t)
	vt := f.started()
	ctx := context.Background()
	f.fake.shutdown = func(string) {
		f.fake.shutdown = nil
		if err := vt.pause(ctx); err != nil {
			t.Error(err)
		}
	}
	if err := vt.kill(ctx, uint32(unix.SIGTERM)); err != nil {
		t.Fatalf("SIGTERM racing a pause: %v", err)
	}
	if err := vt.resume(ctx); err != nil {
		t.Fatal(err)
	}
	calls := f.fake.called()
	if last := calls[len(calls)-1]; last != "shutdown "+vt.rec.Domain {
		t.Errorf("resume did not press the held power button: %v", calls)
	}
}

// QEMU paused the guest by itself (a disk I/O error with the default
// error policy): SIGTERM cannot reach it, and the caller must go on to
// SIGKILL instead of failing the stop.
func TestVMTaskKillPausedByQEMU(t *testing.T) {
	f := newVMFixture(t)
	vt := f.started()
	ctx := context.Background()
	f.fake.mu.Lock()
	f.fake.doms[vt.rec.Domain].paused = true
	f.fake.mu.Unlock()
	if err := vt.kill(ctx, uint32(unix.SIGTERM)); err != nil {
		t.Errorf("SIGTERM to a VM QEMU paused: %v", err)
	}
	if err := vt.kill(ctx, uint32(unix.SIGKILL)); err != nil {
		t.Errorf("SIGKILL: %v", err)
	}
}

func TestVMTaskKillRejectsOtherSignals(t *testing.T) {
	f := newVMFixture(t)
	vt := f.started()
	err := vt.kill(context.Background(), uint32(unix.SIGHUP))
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "SIGKILL") {
		t.Errorf("SIGHUP: %v", err)
	}
}

func TestVMTaskKillBeforeStart(t *testing.T) {
	f := newVMFixture(t)
	vt := f.created()
	if err := vt.kill(context.Background(), uint32(unix.SIGKILL)); err != nil {
		t.Fatal(err)
	}
	if got := waitExit(t, vt); got != 137 {
		t.Errorf("exit %d", got)
	}
}

// QEMU killed as a stop begins, before the power button is pressed (the
// fault cell stopping/qemu): the press finds the domain shut off, the
// kill says the process finished (containerd's stop then waits for the
// exit), and the exit is QEMU's death, 255, never the guest's power-off.
func TestVMTaskQEMUKilledAsTheStopBegins(t *testing.T) {
	f := newVMFixture(t)
	vt := f.started()
	f.fake.shutdown = func(name string) {
		f.fake.shutdown = nil
		f.fake.stop(name, vm.StopCrashed)
	}
	err := vt.kill(context.Background(), uint32(unix.SIGTERM))
	if !errdefs.IsNotFound(err) {
		t.Errorf("SIGTERM to a VM whose QEMU was just killed: %v, want NotFound (process already finished)", err)
	}
	if got := waitExit(t, vt); got != vm.ExitFailed {
		t.Errorf("exit %d, want %d", got, vm.ExitFailed)
	}
}

// QEMU killed just as the power button is pressed (the fault cell
// stopping/qemu, seen on 2.x): libvirtd reaches the monitor of a QEMU
// that is gone before it has the domain shut off, and the press fails
// with "Connection reset by peer". The process has finished: the kill
// says so (NotFound, which containerd's stop takes as done, where an
// Unknown error failed StopContainer), and the exit is 255 once libvirt
// has the domain shut off.
func TestVMTaskQEMUDiesAsThePowerButtonIsPressed(t *testing.T) {
	f := newVMFixture(t)
	vt := f.started()
	f.fake.shutdown = func(name string) {
		f.fake.shutdown = nil
		f.fake.qemuGone(name)
	}
	err := vt.kill(context.Background(), uint32(unix.SIGTERM))
	if !errdefs.IsNotFound(err) {
		t.Errorf("SIGTERM to a VM whose QEMU dies as it is pressed: %v, want NotFound (process already finished)", err)
	}
	f.fake.stopUnwatched(vt.rec.Domain, vm.StopCrashed)
	if got := waitExit(t, vt); got != vm.ExitFailed {
		t.Errorf("exit %d, want %d", got, vm.ExitFailed)
	}
}

// The VM's exit reaches its task from its QEMU's exit, with the reason
// libvirt gives, also when libvirt records the stop after QEMU is gone.
func TestVMTaskExitFromQEMU(t *testing.T) {
	for _, tc := range []struct {
		reason vm.StopReason
		want   uint32
		late   bool // libvirt has the domain shut off only later
	}{
		{vm.StopShutdown, 0, false},
		{vm.StopDestroyed, 137, false},
		{vm.StopFailed, 255, true},
	} {
		f := newVMFixture(t)
		vt := f.started()
		if tc.late {
			f.fake.qemuGone(vt.rec.Domain)
			time.Sleep(100 * time.Millisecond)
			if status, _, _, _ := vt.snapshot(); status != task.Status_RUNNING {
				t.Fatalf("%v: task %s while libvirt still has the domain running", tc.reason, status)
			}
			f.fake.stopUnwatched(vt.rec.Domain, tc.reason)
		} else {
			f.fake.stop(vt.rec.Domain, tc.reason)
		}
		if got := waitExit(t, vt); got != tc.want {
			t.Errorf("%v: exit %d, want %d", tc.reason, got, tc.want)
		}
	}
}

// QEMU dying after the power button was pressed is QEMU's death (255)
// while libvirtd was there to see it: libvirt's "crashed" counts as the
// power-off only when libvirtd was away while the VM stopped.
func TestVMTaskQEMUDiesAfterThePress(t *testing.T) {
	for _, away := range []bool{false, true} {
		f := newVMFixture(t)
		vt := f.started()
		if err := vt.kill(context.Background(), uint32(unix.SIGTERM)); err != nil {
			t.Fatal(err)
		}
		f.fake.qemuGone(vt.rec.Domain) // libvirt still has it running
		time.Sleep(50 * time.Millisecond)
		if away {
			f.fake.reconnected()
		}
		f.fake.stopUnwatched(vt.rec.Domain, vm.StopCrashed)
		want := uint32(vm.ExitFailed)
		if away {
			want = vm.ExitPoweroff
		}
		if got := waitExit(t, vt); got != want {
			t.Errorf("libvirtd away %v: exit %d, want %d", away, got, want)
		}
	}
}

// libvirtd away while the guest powers off: QEMU, run with -no-shutdown,
// waits until the libvirtd that comes back ends it and calls the domain
// crashed. The shim may have reconnected before QEMU ended; the press
// came before the reconnect, so the exit is the power-off.
func TestVMTaskPowerOffWhileLibvirtdAwayEndsAfterTheReconnect(t *testing.T) {
	f := newVMFixture(t)
	vt := f.started()
	if err := vt.kill(context.Background(), uint32(unix.SIGTERM)); err != nil {
		t.Fatal(err)
	}
	f.fake.reconnected() // before QEMU ends
	f.fake.stop(vt.rec.Domain, vm.StopCrashed)
	if got := waitExit(t, vt); got != vm.ExitPoweroff {
		t.Errorf("exit %d, want %d (the guest's power-off)", got, vm.ExitPoweroff)
	}
}

// QEMU gone and libvirt never saying so (it stays away past exitSettle)
// is recorded as the crash libvirtd reports when it finds QEMU gone: not
// before exitSettle, and then at once. The 30 s pass in a synctest
// bubble's fake time; the task has no console, whose socket reads would
// keep the bubble from ever being idle.
func TestVMTaskExitWhenLibvirtNeverSettles(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fake := newFakeDomains()
		// Running, with no console listener (its Accept would never idle).
		fake.doms["vm1-domain"] = &fakeDomain{running: true, exited: make(chan struct{})}
		vt := &vmTask{proc: newProc("vm1", t.TempDir(), stdio{}, func(any) {}), h: &host{conn: fake}, rec: taskRecord{Domain: "vm1-domain"}}
		withLock(&vt.mu, func() { vt.setRunningLocked(4242) })
		w, err := fake.WatchExit("vm1-domain", 4242)
		if err != nil {
			t.Fatal(err)
		}
		go vt.followExit(context.Background(), w)
		start := time.Now()
		fake.qemuGone("vm1-domain") // libvirt still says running
		<-vt.exited
		if waited := time.Since(start); waited < exitSettle || waited > exitSettle+2*time.Second {
			t.Errorf("exit recorded after %v, want just after exitSettle (%v)", waited, exitSettle)
		}
		if _, _, st, _ := vt.snapshot(); st != vm.ExitFailed {
			t.Errorf("exit %d, want %d", st, vm.ExitFailed)
		}
	})
}

func TestVMTaskResyncFindsMissedExit(t *testing.T) {
	f := newVMFixture(t)
	vt := f.started()
	f.fake.stopUnwatched(vt.rec.Domain, vm.StopShutdown) // QEMU's watch saw nothing
	vt.resync(context.Background())
	if got := waitExit(t, vt); got != 0 {
		t.Errorf("exit %d", got)
	}
}

// libvirtd restarted while the shim was held in a Create (the fault cell
// creating/libvirtd): the resync of the reconnect asked for the domain's
// state just as the Start created it, got "shut off" and, once the Start
// let go of the task, recorded that as the exit of the VM that had just
// started (exit 255; CRI then deleted the running VM). A read during the
// Start says nothing of the VM; a stop after it is still found.
func TestVMTaskResyncDuringStartKeepsTheVM(t *testing.T) {
	f := newVMFixture(t)
	vt := f.created()
	ctx := context.Background()
	read := make(chan struct{}, 1)
	f.fake.stateRead = func(string) {
		select {
		case read <- struct{}{}:
		default:
		}
	}
	resynced := make(chan struct{})
	f.fake.starting = func(string) {
		go func() {
			defer close(resynced)
			vt.resync(ctx)
		}()
		select {
		case <-read: // read before the domain runs; the resync goes on after the Start
		case <-resynced:
		case <-time.After(5 * time.Second):
			t.Error("the resync neither read the state nor returned")
		}
	}
	if _, err := vt.start(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-resynced:
	case <-time.After(5 * time.Second):
		t.Fatal("the resync did not return")
	}
	if st, _, _, _ := vt.snapshot(); st != task.Status_RUNNING {
		t.Errorf("after a resync that raced the Start the task is %s, want RUNNING", st)
	}
	if x := f.events.exits(); len(x) != 0 {
		t.Errorf("TaskExit published for a running VM: %+v", x[0])
	}
	f.fake.stop(vt.rec.Domain, vm.StopShutdown) // no event delivered
	vt.resync(ctx)
	if got := waitExit(t, vt); got != 0 {
		t.Errorf("exit %d after the guest powered off", got)
	}
}

// Stats on a VM that stopped before its exit reached the task, and after,
// is NotFound: containerd's metrics collection skips such a task quietly
// but logs any other error (FailedPrecondition "domain is not running" was
// logged on every VM exit).
func TestVMTaskStatsOfStoppedVM(t *testing.T) {
	f := newVMFixture(t)
	vt := f.started()
	st, err := vt.stats(context.Background())
	if err != nil || st.CPUTimeNs == 0 {
		t.Fatalf("stats of a running VM: %+v, %v", st, err)
	}
	f.fake.stopUnwatched(vt.rec.Domain, vm.StopShutdown) // the exit not seen yet
	if _, err := vt.stats(context.Background()); !errdefs.IsNotFound(err) {
		t.Errorf("stats of a VM that stopped behind the task: %v, want NotFound", err)
	}
	vt.resync(context.Background())
	waitExit(t, vt)
	if _, err := vt.stats(context.Background()); !errdefs.IsNotFound(err) {
		t.Errorf("stats of a stopped task: %v, want NotFound", err)
	}
}

func TestVMTaskPauseResume(t *testing.T) {
	f := newVMFixture(t)
	vt := f.started()
	if err := vt.resume(context.Background()); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("resume while running: %v", err)
	}
	if err := vt.pause(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st, _, _, _ := vt.snapshot(); st != task.Status_PAUSED {
		t.Errorf("after pause: %s", st)
	}
	if err := vt.resume(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st, _, _, _ := vt.snapshot(); st != task.Status_RUNNING {
		t.Errorf("after resume: %s", st)
	}
}

// A task deleted before it started ran nothing: no TaskExit, but a Wait
// returns.
func TestVMTaskDeleteUnstarted(t *testing.T) {
	f := newVMFixture(t)
	vt := f.created()
	if err := vt.delete(context.Background()); err != nil {
		t.Fatal(err)
	}
	if exits := f.events.exits(); len(exits) != 0 {
		t.Errorf("TaskExit for a task that never started: %v", exits)
	}
	waitExit(t, vt)
}

func TestVMTaskDeleteLeavesNothing(t *testing.T) {
	f := newVMFixture(t)
	vt := f.started()
	if err := vt.delete(context.Background()); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("delete while running: %v", err)
	}
	f.fake.stop(vt.rec.Domain, vm.StopDestroyed)
	vt.onStopped(context.Background(), vm.StopDestroyed)
	if err := vt.delete(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := f.fake.State(vt.rec.Domain); !errdefs.IsNotFound(err) {
		t.Errorf("domain still defined: %v", err)
	}
	assertGone(t, vt.rec.VMDir, filepath.Join(f.bundle, recordFile))
	// Delete is idempotent at the release level.
	if err := releaseVM(context.Background(), f.fake, &vt.rec, f.bundle); err != nil {
		t.Errorf("second release: %v", err)
	}
}

func TestReleaseVMLeavesSuccessorsDomain(t *testing.T) {
	f := newVMFixture(t)
	vt := f.started()
	f.fake.stop(vt.rec.Domain, vm.StopShutdown)
	// A restarted container of the same pod redefined the domain.
	f.fake.doms[vt.rec.Domain].meta.ContainerID = "vm1-restarted"
	if err := releaseVM(context.Background(), f.fake, &vt.rec, f.bundle); err != nil {
		t.Fatal(err)
	}
	if _, err := f.fake.State(vt.rec.Domain); err != nil {
		t.Errorf("successor's domain was removed: %v", err)
	}
}

// fullMetadata is a metadata annotation with as many entries as allowed.
func fullMetadata() string {
	m := map[string]string{}
	for i := 0; i < configdrive.MaxMetaEntries; i++ {
		m[fmt.Sprintf("k%d", i)] = "v"
	}
	b, _ := json.Marshal(m)
	return string(b)
}

func TestCreateVMTaskBadInputLeavesNothing(t *testing.T) {
	cases := map[string]struct {
		ann    map[string]string
		rootfs bool
		want   string
	}{
		"bad memory":  {ann: map[string]string{annotations.Memory: "lots"}, rootfs: true, want: annotations.Memory},
		"bad vcpus":   {ann: map[string]string{annotations.VCPUs: "-3"}, rootfs: true, want: annotations.VCPUs},
		"no VM image": {want: "/disk/"},
		// 128 entries are allowed; the "namespace" key the shim adds makes 129.
		"metadata full": {ann: map[string]string{annotations.Metadata: fullMetadata()}, rootfs: true,
			want: annotations.Metadata},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			f := newVMFixture(t)
			if tc.rootfs {
				f.kernelRootfs()
			}
			_, err := f.create(tc.ann)
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want InvalidArgument naming %q", err, tc.want)
			}
			for _, c := range f.fake.called() {
				if strings.HasPrefix(c, "define") {
					t.Errorf("a domain was defined: %v", f.fake.called())
				}
			}
			assertGone(t, filepath.Join(f.bundle, recordFile))
			if left, _ := filepath.Glob(filepath.Join(f.host.cfg.StateDir, "vms", "*")); len(left) > 0 {
				t.Errorf("left in state dir: %v", left)
			}
		})
	}
}

// A config drive that fails to build (it is built while the domain is
// defined) rolls back everything, the definition included.
func TestCreateVMTaskConfigDriveFailureLeavesNothing(t *testing.T) {
	f := newVMFixture(t)
	f.kernelRootfs()
	ident := vmplan.Identity{Namespace: "default", ContainerID: "vm1"}
	// A directory where the drive's image goes makes the build fail.
	vmDir := f.host.layout.vmDir(ident.RuntimeKey())
	if err := os.MkdirAll(filepath.Join(vmDir, "config-2.img", "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := f.create(nil); err == nil || !strings.Contains(err.Error(), "config-2.img") {
		t.Fatalf("got %v, want an error naming config-2.img", err)
	}
	if len(f.fake.doms) != 0 {
		t.Errorf("domains left: %v (calls %v)", f.fake.doms, f.fake.called())
	}
	assertGone(t, filepath.Join(f.bundle, recordFile), vmDir)
	if isMountPoint(t, filepath.Join(vmDir, "vmlinuz")) {
		t.Error("kernel mount left")
	}
}

func TestCreateVMTaskDirectKernel(t *testing.T) {
	f := newVMFixture(t)
	f.kernelRootfs()
	// An initrd only root may read is copied, a world-readable kernel
	// bind-mounted read-only.
	if err := os.Chmod(filepath.Join(f.bundle, "rootfs/boot/initrd.img"), 0o600); err != nil {
		t.Fatal(err)
	}
	vt, err := f.create(map[string]string{annotations.KernelCmdline: "console=ttyS0 quiet", annotations.VCPUs: "2"})
	if err != nil {
		t.Fatal(err)
	}
	kernel, initrd := filepath.Join(vt.rec.VMDir, "vmlinuz"), filepath.Join(vt.rec.VMDir, "initrd")
	x := f.fake.doms[vt.rec.Domain].xml
	for _, want := range []string{"<cmdline>console=ttyS0 quiet</cmdline>", `<vcpu placement="static" current="2">4</vcpu>`,
		"<container-id>vm1</container-id>", kernel, initrd} {
		if !strings.Contains(x, want) {
			t.Errorf("domain XML lacks %s:\n%s", want, x)
		}
	}
	for p, want := range map[string]string{kernel: "boot/vmlinuz", initrd: "boot/initrd.img"} {
		if b, readFileErr := os.ReadFile(p); readFileErr != nil || string(b) != want {
			t.Errorf("%s: %q, %v", p, b, readFileErr)
		}
	}
	if !isMountPoint(t, kernel) {
		t.Errorf("kernel %s is not a read-only bind mount", kernel)
	}
	if err = unix.Access(kernel, unix.W_OK); !errors.Is(err, unix.EROFS) {
		t.Errorf("kernel %s writable: access(W_OK) = %v, want EROFS", kernel, err)
	}
	if isMountPoint(t, initrd) {
		t.Errorf("initrd %s (mode 0600 in the image) was mounted, not copied", initrd)
	}
	st, statErr := os.Stat(initrd)
	if statErr != nil || st.Mode().Perm() != 0o600 || st.Sys().(*syscall.Stat_t).Uid != vt.rec.Identity.UID {
		t.Errorf("initrd copy: %v, %v; want mode 0600 owned by the VM's uid %d", st, statErr, vt.rec.Identity.UID)
	}
	rec, err := readRecord(f.bundle)
	if err != nil || rec == nil || rec.Domain != vt.rec.Domain {
		t.Errorf("record %+v, %v", rec, err)
	}
	if err := vt.delete(context.Background()); err != nil {
		t.Fatal(err)
	}
	if isMountPoint(t, kernel) {
		t.Errorf("kernel still mounted after delete")
	}
	assertGone(t, vt.rec.VMDir)
}

// isMountPoint reports whether p is a mount point of this process.
func isMountPoint(t *testing.T, p string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == p {
			return true
		}
	}
	return false
}

func assertGone(t *testing.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s still exists", p)
		}
	}
}

func TestPhasesString(t *testing.T) {
	p := newPhases()
	p.start = p.start.Add(-3 * time.Millisecond)
	p.last = p.start
	p.last = p.last.Add(time.Millisecond) // pretend "a" took 1 ms, and so on
	p.steps = append(p.steps, "a=1.0ms")
	p.mark("b")
	got := p.String()
	if !strings.HasPrefix(got, "a=1.0ms b=") || !strings.Contains(got, " total=") {
		t.Fatalf("phases: %q", got)
	}
}

// A Create whose caller went away (containerd died in the call) leaves no
// task behind: nothing would ever delete it.
func TestCreateOutlivingItsCallerIsUndone(t *testing.T) {
	f := newVMFixture(t)
	vt := f.created()
	if err := abandonIfCallerGone(context.Background(), vt); err != nil {
		t.Fatalf("caller still there: %v", err)
	}
	if _, err := f.fake.State(vt.rec.Domain); err != nil {
		t.Fatalf("the domain went though the caller is there: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := abandonIfCallerGone(ctx, vt); err == nil {
		t.Fatal("no error for a Create whose caller went away")
	}
	if _, err := f.fake.State(vt.rec.Domain); !errdefs.IsNotFound(err) {
		t.Errorf("the domain of an abandoned Create is still defined: %v", err)
	}
	if _, err := os.Stat(vt.rec.VMDir); !os.IsNotExist(err) {
		t.Errorf("the VM dir of an abandoned Create is still there: %v", err)
	}
	if rec, err := readRecord(f.bundle); err != nil || rec != nil {
		t.Errorf("the task record of an abandoned Create: %v %v", rec, err)
	}
}
