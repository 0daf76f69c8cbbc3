package shim

import (
	"encoding/xml"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/digitalocean/go-libvirt"

	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm/vmtest"
)

// fakeDomains is libvirt with state: defined domains, which run, and a
// console socket per running domain. Tests drive exits by calling stop.
type fakeDomains struct {
	mu        sync.Mutex
	doms      map[string]*fakeDomain
	calls     []string
	startErr  error
	starting  func(name string) // called as a Start begins, without mu
	stateRead func(name string) // called after a State read, without mu
	resumed   func(name string) // called after a Resume, without mu
	shutdown  func(name string) // called as a Shutdown begins, without mu
	destroyed func(name string) // called after a Destroy, without mu
	guest     *vmtest.FakeGuest // the agent of every domain
	pid       int               // QEMU's pid for every domain; 0 is 4242
	vcpuErr   error             // a plug (SetVCPUs growing) fails with it, after plugging one vCPU
	lateErr   error             // SetVCPUs fails with it, yet makes the change (a guest slower than libvirt waits)
	memStuck  bool              // the guest plugs no more than it has (RequestMemory times out)
	cpuStuck  bool              // the guest's agent answers SetGuestVCPUs but its CPUs stay as they are
	reconnect uint64            // Reconnects: how often libvirtd was away and back
}

type fakeDomain struct {
	xml      string
	meta     vm.Metadata
	running  bool
	paused   bool
	reason   vm.StopReason
	exited   chan struct{} // closed when the domain stops: its QEMU's exit
	qemuDead bool          // QEMU exited; libvirt may not know yet
	panicked bool          // the guest panicked: QEMU holds it (libvirt: crashed) until destroyed
	console  string
	listener net.Listener
	conns    []net.Conn       // guarded by fakeDomains.mu
	vcpus    int              // QEMU's vCPUs, from the XML's <vcpu current>
	offline  int              // of vcpus, how many the guest has offline
	plug     vm.PluggedMemory // the virtio-mem device
}

var _ domains = (*fakeDomains)(nil)

func newFakeDomains() *fakeDomains {
	return &fakeDomains{doms: map[string]*fakeDomain{}, guest: vmtest.NewFakeGuest()}
}

func (f *fakeDomains) record(call string) { f.calls = append(f.calls, call) }

func (f *fakeDomains) called() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func (f *fakeDomains) get(name string) (*fakeDomain, error) {
	d, ok := f.doms[name]
	if !ok {
		return nil, fmt.Errorf("domain %s: %w", name, errdefs.ErrNotFound)
	}
	return d, nil
}

func (f *fakeDomains) Identity(name string) (*vm.Identity, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, err := f.get(name)
	if err != nil {
		return nil, err
	}
	return vm.IdentityFromXML(d.xml)
}

func (f *fakeDomains) Define(b []byte) error {
	var d struct {
		Name     string `xml:"name"`
		Metadata struct {
			VM vm.Metadata `xml:"vm"`
		} `xml:"metadata"`
		Serial struct {
			Source struct {
				Path string `xml:"path,attr"`
			} `xml:"source"`
		} `xml:"devices>serial"`
		VCPU struct {
			Current int `xml:"current,attr"`
			Max     int `xml:",chardata"`
		} `xml:"vcpu"`
	}
	if err := xml.Unmarshal(b, &d); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("define " + d.Name)
	vcpus := d.VCPU.Current
	if vcpus == 0 {
		vcpus = d.VCPU.Max
	}
	f.doms[d.Name] = &fakeDomain{xml: string(b), meta: d.Metadata.VM, console: d.Serial.Source.Path, vcpus: vcpus}
	return nil
}

func (f *fakeDomains) Start(name string, paused bool) error {
	if f.starting != nil {
		f.starting(name)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("start " + name)
	d, err := f.get(name)
	if err != nil {
		return err
	}
	if f.startErr != nil {
		return f.startErr
	}
	l, err := net.Listen("unix", d.console)
	if err != nil {
		return err
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("KVM-GUEST-READY\n"))
			f.mu.Lock()
			d.conns = append(d.conns, c)
			f.mu.Unlock()
		}
	}()
	d.listener, d.running, d.paused = l, true, paused
	d.exited, d.qemuDead = make(chan struct{}), false
	return nil
}

// stop ends a running domain as libvirt would: QEMU exits and closes the
// console.
func (f *fakeDomains) stop(name string, reason vm.StopReason) {
	f.qemuGone(name)
	f.stopUnwatched(name, reason)
}

// qemuGone ends the domain's QEMU process, which libvirt has not seen
// yet: the domain still runs to libvirt.
func (f *fakeDomains) qemuGone(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := f.doms[name]
	if d.exited != nil {
		close(d.exited)
		d.exited = nil
	}
	d.qemuDead = true
}

// stopUnwatched stops the domain as libvirt sees it while the watch of
// its QEMU reports nothing (an exit only a re-read of the state finds).
func (f *fakeDomains) stopUnwatched(name string, reason vm.StopReason) {
	f.mu.Lock()
	defer f.mu.Unlock()
	stopLocked(f.doms[name], reason)
}

// guestPanics has the guest of a running domain panic, as its pvpanic
// device and on_crash preserve make it: QEMU stays, libvirt says crashed.
func (f *fakeDomains) guestPanics(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.doms[name].panicked = true
}

// stopLocked stops d as libvirt sees it; f.mu is held.
func stopLocked(d *fakeDomain, reason vm.StopReason) {
	d.running, d.paused, d.panicked, d.reason = false, false, false, reason
	if d.listener != nil {
		d.listener.Close()
	}
	for _, c := range d.conns {
		c.Close()
	}
	d.conns = nil
}

func (f *fakeDomains) simple(call, name string, fn func(*fakeDomain) error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record(call + " " + name)
	d, err := f.get(name)
	if err != nil {
		return err
	}
	return fn(d)
}

func notRunning(name string) error {
	return fmt.Errorf("domain %s is not running: %w", name, errdefs.ErrFailedPrecondition)
}

func (f *fakeDomains) Resume(name string) error {
	err := f.simple("resume", name, func(d *fakeDomain) error { d.paused = false; return nil })
	if err == nil && f.resumed != nil {
		f.resumed(name)
	}
	return err
}

func (f *fakeDomains) Suspend(name string) error {
	return f.simple("suspend", name, func(d *fakeDomain) error { d.paused = true; return nil })
}

func (f *fakeDomains) Shutdown(name string) error {
	if f.shutdown != nil {
		f.shutdown(name)
	}
	return f.simple("shutdown", name, func(d *fakeDomain) error {
		if !d.running || d.paused { // libvirt: "domain is not running"
			return notRunning(name)
		}
		if d.qemuDead { // libvirt reaches the monitor of a QEMU just gone
			return fmt.Errorf("power off domain %s: Unable to read from monitor: Connection reset by peer", name)
		}
		return nil
	})
}

func (f *fakeDomains) Destroy(name string) error {
	if f.destroyed != nil {
		defer f.destroyed(name)
	}
	return f.simple("destroy", name, func(d *fakeDomain) error {
		if !d.running {
			return notRunning(name)
		}
		if d.panicked { // the tests stop other domains themselves
			if d.exited != nil {
				close(d.exited)
				d.exited = nil
			}
			d.qemuDead = true
			stopLocked(d, vm.StopDestroyed)
		}
		return nil
	})
}

func (f *fakeDomains) Undefine(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("undefine " + name)
	delete(f.doms, name)
	return nil
}

func (f *fakeDomains) State(name string) (vm.State, error) {
	if f.stateRead != nil {
		defer f.stateRead(name)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	d, err := f.get(name)
	if err != nil {
		return vm.State{}, err
	}
	return vm.State{Running: d.running, Paused: d.paused, Panicked: d.panicked, Reason: d.reason}, nil
}

func (f *fakeDomains) Stats(name string) (vm.Stats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, err := f.get(name)
	if err != nil {
		return vm.Stats{}, err
	}
	if !d.running { // libvirt's memory stats: "domain is not running"
		return vm.Stats{}, notRunning(name)
	}
	return vm.Stats{CPUTimeNs: 42, RSSBytes: 1 << 20, MemoryBytes: 256 << 20}, nil
}

func (f *fakeDomains) Metadata(name string) (vm.Metadata, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, err := f.get(name)
	if err != nil {
		return vm.Metadata{}, err
	}
	return d.meta, nil
}

// AgentCommand reaches the fake guest's agent while the domain runs; a
// stopped domain fails as libvirt's does.
func (f *fakeDomains) AgentCommand(name string, cmd []byte, timeout time.Duration) ([]byte, error) {
	f.mu.Lock()
	d, err := f.get(name)
	running := err == nil && d.running
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if !running {
		return nil, libvirt.Error{Code: uint32(libvirt.ErrOperationInvalid), Message: "domain is not running"}
	}
	return f.guest.AgentCommand(name, cmd, timeout)
}

func (f *fakeDomains) SetAgentTimeout(name string, timeout time.Duration) error {
	return f.guest.SetAgentTimeout(name, timeout)
}

func (f *fakeDomains) PID(name string) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pid != 0 {
		return f.pid, nil
	}
	return 4242, nil
}

func (f *fakeDomains) Connected() bool { return true }

func (f *fakeDomains) Reconnects() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reconnect
}

// reconnected counts one more time libvirtd was away and back.
func (f *fakeDomains) reconnected() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reconnect++
}

// WatchExit reports the exit when a test ends the domain's QEMU (stop,
// qemuGone); Destroy records the call and stops nothing.
func (f *fakeDomains) WatchExit(name string, pid int) (*vm.ExitWatch, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, err := f.get(name)
	if err != nil {
		return nil, err
	}
	if d.exited == nil {
		gone := make(chan struct{})
		close(gone)
		return vm.ExitWhen(gone), nil
	}
	return vm.ExitWhen(d.exited), nil
}

func (f *fakeDomains) VirtiofsdPIDs(name string) (daemons, all []int, err error) {
	return nil, nil, nil
}

func (f *fakeDomains) SetVCPUs(name string, n int) error {
	return f.simple(fmt.Sprintf("setvcpus %d", n), name, func(d *fakeDomain) error {
		if !d.running {
			return notRunning(name)
		}
		if f.vcpuErr != nil && n > d.vcpus {
			d.vcpus++
			return f.vcpuErr
		}
		d.vcpus = n
		return f.lateErr
	})
}

func (f *fakeDomains) RequestMemory(name string, mib int, timeout time.Duration) (vm.PluggedMemory, error) {
	var p vm.PluggedMemory
	err := f.simple(fmt.Sprintf("requestmemory %d", mib), name, func(d *fakeDomain) error {
		if !d.running {
			return notRunning(name)
		}
		d.plug.RequestedMiB = mib
		if f.memStuck && mib != d.plug.CurrentMiB {
			p = d.plug
			return fmt.Errorf("the guest has %d MiB plugged after %s: %w", d.plug.CurrentMiB, timeout, errdefs.ErrFailedPrecondition)
		}
		d.plug.CurrentMiB = mib
		p = d.plug
		return nil
	})
	return p, err
}

func (f *fakeDomains) Plugged(name string) (vm.PluggedMemory, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, err := f.get(name)
	if err != nil {
		return vm.PluggedMemory{}, err
	}
	return d.plug, nil
}

// SetGuestVCPUs offlines the highest vCPUs or onlines offline ones, as
// libvirt does through the guest agent; vm.Conn's errors when no agent
// answers.
func (f *fakeDomains) SetGuestVCPUs(name string, n int, _ time.Duration) error {
	return f.simple(fmt.Sprintf("setguestvcpus %d", n), name, func(d *fakeDomain) error {
		switch {
		case !d.running:
			return notRunning(name)
		case f.guest.Absent():
			return fmt.Errorf("domain %s: %w: %w", name, vm.ErrNoAgent, errdefs.ErrFailedPrecondition)
		case n < 1 || n > d.vcpus:
			return fmt.Errorf("guest agent reports less cpu than requested: %w", errdefs.ErrInvalidArgument)
		case !f.cpuStuck:
			d.offline = d.vcpus - n
		}
		return nil
	})
}

func (f *fakeDomains) GuestVCPUs(name string) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, err := f.get(name)
	if err != nil {
		return 0, err
	}
	if f.guest.Absent() {
		return 0, fmt.Errorf("domain %s: %w: %w", name, vm.ErrNoAgent, errdefs.ErrFailedPrecondition)
	}
	return d.vcpus - d.offline, nil
}

func (f *fakeDomains) VCPUs(name string) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, err := f.get(name)
	if err != nil {
		return 0, err
	}
	return d.vcpus, nil
}

func (f *fakeDomains) Domains() (map[string]vm.Metadata, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]vm.Metadata, len(f.doms))
	for name, d := range f.doms {
		out[name] = d.meta
	}
	return out, nil
}
