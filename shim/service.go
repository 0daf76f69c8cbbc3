package shim

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/containerd/api/types"
	apitask "github.com/containerd/containerd/api/types/task"

	// Only for ToGRPC (the module at v0.3.0 has no gRPC mapping); the
	// error classes come from github.com/containerd/errdefs, as everywhere.
	errgrpc "github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/mount"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/pkg/shutdown"
	"github.com/containerd/containerd/protobuf"
	ptypes "github.com/containerd/containerd/protobuf/types"
	"github.com/containerd/containerd/runtime/v2/shim"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kvm-shim/containerd-shim-kvm-v1/config"
	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/faultpoint"
	"github.com/kvm-shim/containerd-shim-kvm-v1/netfd"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vmplan"
)

// CRI's annotations on the OCI spec that the shim reads.
const (
	annContainerType = "io.kubernetes.cri.container-type"
	annSandboxID     = "io.kubernetes.cri.sandbox-id"
	annSandboxName   = "io.kubernetes.cri.sandbox-name"
	annSandboxNS     = "io.kubernetes.cri.sandbox-namespace"
	annSandboxUID    = "io.kubernetes.cri.sandbox-uid"
	annContainerName = "io.kubernetes.cri.container-name"
	annImageName     = "io.kubernetes.cri.image-name"
)

// taskRunner is what the service needs of a sandbox or VM task.
type taskRunner interface {
	base() *proc
	start(context.Context) (int, error)
	kill(context.Context, uint32) error
	pause(context.Context) error
	resume(context.Context) error
}

func (p *proc) base() *proc { return p }

var (
	_ taskRunner          = (*vmTask)(nil)
	_ taskRunner          = (*sandboxTask)(nil)
	_ taskAPI.TaskService = (*service)(nil)
)

// service is the task API of one shim. Each method finds the task and
// delegates; errors become gRPC codes in the interceptor, once.
type service struct {
	shutdown  shutdown.Service
	publisher shim.Publisher
	events    *eventQueue
	kvm       vm.KVMInfo  // detected once at start
	trim      *memTrimmer // after Create, Start and Delete

	createMu sync.Mutex // one Create at a time; Shutdown waits for it

	// hostMu is held while the host is made (a libvirt connection, up to
	// its dial timeout), so that mu stays free for every other call.
	// Order: createMu, hostMu, mu.
	hostMu     sync.Mutex
	hostClosed bool      // guarded by hostMu; set by Shutdown
	hostErr    error     // guarded by hostMu; the last failed attempt to make the host
	hostErrAt  time.Time // guarded by hostMu; when it failed
	newHost    func(context.Context, config.Config, vm.KVMInfo) (*host, error)

	mu    sync.Mutex
	tasks map[string]taskRunner // guarded by mu
	cfg   *config.Config        // guarded by mu; loaded at the first Create
	host  *host                 // guarded by mu, set under hostMu; made at the first VM Create or ahead of it
	plain map[string]*plainTask // guarded by mu; the tasks runc runs (plain.go)

	runc runcRuntime // made at the first Create with plain_containers on
}

func newService(ctx context.Context, publisher shim.Publisher, sd shutdown.Service) (*service, error) {
	s := &service{
		shutdown:  sd,
		publisher: publisher,
		plain:     make(map[string]*plainTask),
		events:    newEventQueue(ctx, publisher),
		kvm:       vm.DetectKVM(),
		tasks:     make(map[string]taskRunner),
		trim:      newMemTrimmer(),
		newHost:   newHost,
	}
	sd.RegisterCallback(func(context.Context) error {
		s.trim.stop()
		s.events.close()
		return nil
	})
	if address, err := shim.ReadAddress("address"); err == nil {
		sd.RegisterCallback(func(context.Context) error { return shim.RemoveSocket(address) })
	}
	return s, nil
}

// RegisterTTRPC makes the service a ttrpc plugin of the shim library.
func (s *service) RegisterTTRPC(server *ttrpc.Server) error {
	taskAPI.RegisterTaskService(server, plainRouter{s})
	return nil
}

// UnaryInterceptor turns errors into gRPC status codes at the boundary,
// and a panic in a method into an Internal error (panics.go).
func (s *service) UnaryInterceptor() ttrpc.UnaryServerInterceptor {
	return func(ctx context.Context, unmarshal ttrpc.Unmarshaler, info *ttrpc.UnaryServerInfo, method ttrpc.Method) (interface{}, error) {
		resp, err := recoverCalls(ctx, unmarshal, info, method)
		return resp, errgrpc.ToGRPC(err)
	}
}

// get finds a task, or one of its exec processes when execID is set.
func (s *service) get(id, execID string) (taskRunner, error) {
	var t taskRunner
	var ok bool
	withLock(&s.mu, func() { t, ok = s.tasks[id] })
	if !ok {
		return nil, fmt.Errorf("task %s: %w", id, errdefs.ErrNotFound)
	}
	if execID == "" {
		return t, nil
	}
	v, ok := t.(*vmTask)
	if !ok {
		return nil, fmt.Errorf("exec %s in task %s: %w", execID, id, errdefs.ErrNotFound)
	}
	return v.getExec(execID)
}

func (s *service) Create(ctx context.Context, r *taskAPI.CreateTaskRequest) (*taskAPI.CreateTaskResponse, error) {
	defer s.trim.soon()
	s.createMu.Lock()
	defer s.createMu.Unlock()
	took := newPhases()
	if _, err := s.get(r.ID, ""); err == nil {
		return nil, fmt.Errorf("task %s: %w", r.ID, errdefs.ErrAlreadyExists)
	}
	if rs, _ := s.plainFor(r.ID); rs != nil {
		return nil, fmt.Errorf("task %s: %w", r.ID, errdefs.ErrAlreadyExists)
	}
	if r.Checkpoint != "" || r.ParentCheckpoint != "" {
		return nil, fmt.Errorf("restoring a VM from a checkpoint: %w", errdefs.ErrNotImplemented)
	}
	spec, err := readSpec(r.Bundle)
	if err != nil {
		return nil, err
	}
	cfg, err := s.config(r.Options)
	if err != nil {
		return nil, err
	}
	req := createRequest{
		id: r.ID, bundle: r.Bundle, spec: spec, rootfs: mounts(r.Rootfs),
		stdio: stdio{Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr, Terminal: r.Terminal},
		took:  took,
	}
	rt, err := s.route(ctx, cfg, spec, req)
	if err != nil {
		return nil, err
	}
	if rt == routePlain || rt == routePauseSandbox {
		resp, plainErr := s.createPlain(ctx, r, req, cfg.StateDir, rt)
		if plainErr == nil && rt == routePauseSandbox {
			goSafe(ctx, "connect to libvirt ahead of the pod's VMs", func() { s.prepareHost(context.WithoutCancel(ctx), cfg) })
		}
		return resp, plainErr
	}
	ident := identity(ctx, r.ID, spec)
	var t taskRunner
	if spec.Annotations[annContainerType] == "sandbox" {
		if t, err = createSandboxTask(ctx, layout{root: cfg.StateDir}, req, ident, s.events.send); err == nil {
			goSafe(ctx, "connect to libvirt ahead of the pod's VMs", func() { s.prepareHost(context.WithoutCancel(ctx), cfg) })
		}
	} else {
		sbNetns, sbNet := s.sandboxNetwork(ident.SandboxID)
		req.netns = podNetns(spec, sbNetns)
		if req.netns == sbNetns {
			req.podNet = sbNet
		}
		var h *host
		if h, err = s.vmHost(ctx, cfg); err == nil {
			// spec, shim config and, at the shim's first VM, the libvirt
			// connection (or what is left of prepareHost's)
			took.mark("host")
			var vt *vmTask
			if vt, err = createVMTask(ctx, h, req, ident, s.events.send); err == nil {
				t, err = vt, abandonIfCallerGone(ctx, vt)
			}
		}
	}
	if err != nil {
		return nil, err
	}
	withLock(&s.mu, func() { s.tasks[r.ID] = t })
	t.base().created(r.Rootfs)
	return &taskAPI.CreateTaskResponse{}, nil
}

func (s *service) Start(ctx context.Context, r *taskAPI.StartRequest) (*taskAPI.StartResponse, error) {
	if r.ExecID == "" { // an exec (a probe each few seconds) leaves little garbage
		defer s.trim.soon()
	}
	t, err := s.get(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	pid, err := t.start(ctx)
	if err != nil {
		return nil, err
	}
	// The task queued its TaskStart as it became RUNNING.
	if v, ok := t.(*vmTask); ok {
		// An exit during Start had no running task to land on. The check
		// asks libvirt, so it runs after the reply.
		goSafe(ctx, "re-read the VM's state after Start", func() { v.resync(context.WithoutCancel(ctx)) })
	}
	return &taskAPI.StartResponse{Pid: uint32(pid)}, nil
}

func (s *service) State(ctx context.Context, r *taskAPI.StateRequest) (*taskAPI.StateResponse, error) {
	t, err := s.get(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	p := t.base()
	status, pid, exitStatus, exitedAt := p.snapshot()
	return &taskAPI.StateResponse{
		ID: p.name(), ExecID: p.execID, Bundle: p.bundle, Pid: uint32(pid), Status: status,
		Stdin: p.stdio.Stdin, Stdout: p.stdio.Stdout, Stderr: p.stdio.Stderr, Terminal: p.stdio.Terminal,
		ExitStatus: exitStatus, ExitedAt: protobuf.ToTimestamp(exitedAt),
	}, nil
}

func (s *service) Kill(ctx context.Context, r *taskAPI.KillRequest) (*ptypes.Empty, error) {
	t, err := s.get(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	return &ptypes.Empty{}, t.kill(ctx, r.Signal)
}

func (s *service) Wait(ctx context.Context, r *taskAPI.WaitRequest) (*taskAPI.WaitResponse, error) {
	t, err := s.get(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	status, at, err := t.base().wait(ctx)
	if err != nil {
		return nil, err
	}
	return &taskAPI.WaitResponse{ExitStatus: status, ExitedAt: protobuf.ToTimestamp(at)}, nil
}

func (s *service) Delete(ctx context.Context, r *taskAPI.DeleteRequest) (*taskAPI.DeleteResponse, error) {
	if r.ExecID == "" { // an exec (a probe each few seconds) leaves little garbage
		defer s.trim.soon()
	}
	t, err := s.get(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	switch t := t.(type) {
	case *vmTask:
		err = t.delete(ctx)
	case *sandboxTask:
		err = t.delete(ctx, s.podHasVMs(t.rec.PodUID))
	case *execProcess:
		if err = t.task.deleteExec(t); err != nil {
			return nil, err
		}
		_, pid, status, at := t.snapshot()
		return &taskAPI.DeleteResponse{Pid: uint32(pid), ExitStatus: status, ExitedAt: protobuf.ToTimestamp(at)}, nil
	}
	if err != nil {
		return nil, err
	}
	withLock(&s.mu, func() { delete(s.tasks, r.ID) })
	t.base().deleted()
	_, pid, status, at := t.base().snapshot()
	return &taskAPI.DeleteResponse{Pid: uint32(pid), ExitStatus: status, ExitedAt: protobuf.ToTimestamp(at)}, nil
}

func (s *service) Pids(ctx context.Context, r *taskAPI.PidsRequest) (*taskAPI.PidsResponse, error) {
	t, err := s.get(r.ID, "")
	if err != nil {
		return nil, err
	}
	resp := &taskAPI.PidsResponse{}
	if status, pid, _, _ := t.base().snapshot(); status == apitask.Status_RUNNING || status == apitask.Status_PAUSED {
		resp.Processes = append(resp.Processes, &apitask.ProcessInfo{Pid: uint32(pid)})
	}
	return resp, nil
}

func (s *service) Pause(ctx context.Context, r *taskAPI.PauseRequest) (*ptypes.Empty, error) {
	t, err := s.get(r.ID, "")
	if err != nil {
		return nil, err
	}
	if err := t.pause(ctx); err != nil {
		return nil, err
	}
	return &ptypes.Empty{}, nil
}

func (s *service) Resume(ctx context.Context, r *taskAPI.ResumeRequest) (*ptypes.Empty, error) {
	t, err := s.get(r.ID, "")
	if err != nil {
		return nil, err
	}
	if err := t.resume(ctx); err != nil {
		return nil, err
	}
	return &ptypes.Empty{}, nil
}

func (s *service) Stats(ctx context.Context, r *taskAPI.StatsRequest) (*taskAPI.StatsResponse, error) {
	t, err := s.get(r.ID, "")
	if err != nil {
		return nil, err
	}
	var st vm.Stats
	if v, ok := t.(*vmTask); ok {
		if v.cgroup != nil {
			stats, statsErr := v.cgroupStats(ctx)
			if statsErr != nil {
				return nil, statsErr
			}
			return &taskAPI.StatsResponse{Stats: stats}, nil
		}
		if st, err = v.stats(ctx); err != nil {
			return nil, err
		}
	}
	stats, err := metrics(st)
	if err != nil {
		return nil, err
	}
	return &taskAPI.StatsResponse{Stats: stats}, nil
}

func (s *service) Connect(ctx context.Context, r *taskAPI.ConnectRequest) (*taskAPI.ConnectResponse, error) {
	t, err := s.get(r.ID, "")
	if err != nil {
		return nil, err
	}
	// Not snapshot: a Start in flight holds the task's lock.
	pid := t.base().lastPid.Load()
	return &taskAPI.ConnectResponse{ShimPid: uint32(os.Getpid()), TaskPid: uint32(pid)}, nil
}

// Shutdown ends the shim once no task is left in it.
func (s *service) Shutdown(ctx context.Context, r *taskAPI.ShutdownRequest) (*ptypes.Empty, error) {
	// containerd asks after every task's Delete: a shim with tasks left
	// answers at once.
	if s.hasTasks() {
		return &ptypes.Empty{}, nil
	}
	// Otherwise no Create may be halfway, and a host being made ahead of
	// the VMs is waited for and closed too.
	s.createMu.Lock()
	defer s.createMu.Unlock()
	s.hostMu.Lock()
	defer s.hostMu.Unlock()
	var h *host
	var busy bool
	withLock(&s.mu, func() {
		if busy = len(s.tasks) > 0 || len(s.plain) > 0; !busy {
			h, s.host = s.host, nil
		}
	})
	if busy {
		return &ptypes.Empty{}, nil
	}
	s.hostClosed = true
	if h != nil {
		// A clean disconnect (bounded: Close gives up after 2 s) rather
		// than a socket that vanishes when the process exits.
		_ = h.close()
	}
	s.shutdown.Shutdown()
	return &ptypes.Empty{}, nil
}

// CloseIO ends an exec's stdin, which the guest agent hands over once it
// is complete. The guest's console has no end-of-input: for the task
// itself it does nothing.
func (s *service) CloseIO(ctx context.Context, r *taskAPI.CloseIORequest) (*ptypes.Empty, error) {
	t, err := s.get(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if e, ok := t.(*execProcess); ok && r.Stdin {
		e.closeStdin()
	}
	return &ptypes.Empty{}, nil
}

// Exec registers a command to run in the VM's guest (see shim/exec.go).
func (s *service) Exec(ctx context.Context, r *taskAPI.ExecProcessRequest) (*ptypes.Empty, error) {
	t, err := s.get(r.ID, "")
	if err != nil {
		return nil, err
	}
	v, ok := t.(*vmTask)
	if !ok {
		return nil, fmt.Errorf("exec in %s: a pod sandbox runs no guest: %w", r.ID, errdefs.ErrFailedPrecondition)
	}
	_, err = v.addExec(ctx, r.ExecID, stdio{Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr, Terminal: r.Terminal}, r.Spec)
	return &ptypes.Empty{}, err
}

// ResizePty of the task (kubectl attach -it, ctr task attach) is accepted
// and has no effect: the console is a serial line, which carries no window
// size; the guest keeps its own (stty rows N cols M in the guest sets it).
// An exec has no terminal to resize.
func (s *service) ResizePty(ctx context.Context, r *taskAPI.ResizePtyRequest) (*ptypes.Empty, error) {
	if _, err := s.get(r.ID, r.ExecID); err != nil {
		return nil, err
	}
	if r.ExecID != "" {
		return nil, errTTY
	}
	log.G(ctx).WithField("id", r.ID).WithField("width", r.Width).WithField("height", r.Height).
		Debug("resize of a serial console: nothing to do, a serial line has no window size")
	return &ptypes.Empty{}, nil
}

func (s *service) Update(ctx context.Context, r *taskAPI.UpdateTaskRequest) (*ptypes.Empty, error) {
	t, err := s.get(r.ID, "")
	if err != nil {
		return nil, err
	}
	res, err := updateResources(r.Resources)
	if err != nil {
		return nil, err
	}
	v, ok := t.(*vmTask)
	if !ok {
		// The sandbox runs nothing its resources could bound.
		return &ptypes.Empty{}, nil
	}
	if err := v.update(ctx, res); err != nil {
		return nil, err
	}
	return &ptypes.Empty{}, nil
}

func (s *service) Checkpoint(ctx context.Context, r *taskAPI.CheckpointTaskRequest) (*ptypes.Empty, error) {
	return nil, fmt.Errorf("checkpointing a VM is not supported yet: %w", errdefs.ErrNotImplemented)
}

// config loads the shim config at the first Create; later Creates reuse it.
func (s *service) config(options *anypb.Any) (*config.Config, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cfg != nil {
		return s.cfg, nil
	}
	path, err := configPath(options)
	if err != nil {
		return nil, err
	}
	cfg, err := config.Load(path)
	if err != nil {
		return nil, err
	}
	s.cfg = &cfg
	faultpoint.SetDir(cfg.StateDir)
	return s.cfg, nil
}

// vmHost connects to libvirt at the first VM Create (or returns the
// connection prepareHost made) and starts following its reconnects.
// Other calls go on meanwhile: only hostMu is held while it connects.
func (s *service) vmHost(ctx context.Context, cfg *config.Config) (*host, error) {
	arrived := time.Now()
	s.hostMu.Lock()
	defer s.hostMu.Unlock()
	if s.hostClosed {
		return nil, fmt.Errorf("connect to libvirt: the shim is shutting down: %w", errdefs.ErrUnavailable)
	}
	var h *host
	withLock(&s.mu, func() { h = s.host })
	if h != nil {
		return h, nil
	}
	// An attempt that failed while this caller waited is its answer too:
	// a Create behind prepareHost does not wait for a second dial timeout.
	if s.hostErr != nil && s.hostErrAt.After(arrived) {
		return nil, s.hostErr
	}
	h, err := s.newHost(ctx, *cfg, s.kvm)
	if err != nil {
		s.hostErr, s.hostErrAt = err, time.Now()
		return nil, err
	}
	// The sweep runs before any Create of this shim can use the host: a
	// pod re-created after a power loss takes its lost VM's domain name
	// again, and a sweep running beside that Create could undefine the
	// new definition between its Define and its Start. A CRI pod's
	// sandbox start (prepareHost) does it ahead of the pod's first VM.
	scope := sweepScope{layout: h.layout, conn: h.conn, fdSocketDir: h.fdSocketDir, release: h.releaseHeld}
	sweep(context.WithoutCancel(ctx), scope, time.Now())
	withLock(&s.mu, func() { s.host = h })
	goSafe(ctx, "follow libvirt events", func() { s.followEvents(context.WithoutCancel(ctx), h) })
	return h, nil
}

// prepareHost makes the libvirt connection while a CRI pod's sandbox
// starts, so the pod's first VM Create finds it ready. A failure is only
// logged here: a VM Create that waited for this attempt reports its
// error, a later one tries again.
func (s *service) prepareHost(ctx context.Context, cfg *config.Config) {
	if _, err := s.vmHost(ctx, cfg); err != nil {
		log.G(ctx).WithError(err).Debug("connect to libvirt ahead of the pod's VMs")
	}
}

// followEvents re-reads the VMs' state after a libvirt reconnect. A VM's
// stop reaches its task from its QEMU's exit (vmTask.followExit).
func (s *service) followEvents(ctx context.Context, h *host) {
	for ev := range h.events {
		switch ev.Kind {
		case vm.EventReconnected:
			for _, t := range s.vmTasks("") {
				goSafe(ctx, "re-read a VM's state after a libvirt reconnect", func() { t.resync(ctx) })
			}
		}
	}
}

// vmTasks returns the VM tasks of a domain, or all with domain "". A
// restarted container's old task may still share its domain name.
func (s *service) vmTasks(domain string) []*vmTask {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*vmTask
	for _, t := range s.tasks {
		if v, ok := t.(*vmTask); ok && (domain == "" || v.rec.Domain == domain) {
			out = append(out, v)
		}
	}
	return out
}

// sandboxNetwork is the network namespace recorded by the pod's sandbox
// task, and the network it found there, if this shim serves it.
func (s *service) sandboxNetwork(sandboxID string) (string, *netfd.PodNetwork) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sb, ok := s.tasks[sandboxID].(*sandboxTask); ok && sandboxID != "" {
		return sb.netns, sb.podNet
	}
	if pt, ok := s.plain[sandboxID]; ok && sandboxID != "" && pt.sandbox != nil {
		return pt.sandbox.netns, pt.sandbox.podNet
	}
	return "", nil
}

func (s *service) hasTasks() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.tasks) > 0 || len(s.plain) > 0
}

func (s *service) podHasVMs(podUID string) bool {
	if podUID == "" {
		return false
	}
	for _, t := range s.vmTasks("") {
		if t.rec.PodUID == podUID {
			return true
		}
	}
	return false
}

func readSpec(bundle string) (*specs.Spec, error) {
	b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("read OCI spec: %w", err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return nil, fmt.Errorf("parse OCI spec %s: %v: %w", filepath.Join(bundle, "config.json"), err, errdefs.ErrInvalidArgument)
	}
	if spec.Annotations == nil {
		spec.Annotations = map[string]string{}
	}
	return &spec, nil
}

func identity(ctx context.Context, id string, spec *specs.Spec) vmplan.Identity {
	ns, _ := namespaces.Namespace(ctx)
	a := spec.Annotations
	return vmplan.Identity{
		Namespace: ns, ContainerID: id, SandboxID: a[annSandboxID],
		PodUID: a[annSandboxUID], PodName: a[annSandboxName], PodNamespace: a[annSandboxNS],
		ContainerName: a[annContainerName],
	}
}

func mounts(in []*types.Mount) []mount.Mount {
	out := make([]mount.Mount, 0, len(in))
	for _, m := range in {
		out = append(out, mount.Mount{Type: m.Type, Source: m.Source, Options: m.Options})
	}
	return out
}
