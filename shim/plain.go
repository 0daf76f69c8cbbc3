package shim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/containerd/mount"
	"github.com/containerd/containerd/pkg/process"
	runctask "github.com/containerd/containerd/runtime/v2/runc/task"
	"github.com/containerd/containerd/runtime/v2/shim"
	"github.com/containerd/containerd/sys/reaper"
	"github.com/containerd/errdefs"
	runcC "github.com/containerd/go-runc"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/childproc"
)

// Plain containers (no VM image) and, with plain_containers on, the
// pod's sandbox run through containerd's own runc shim task service
// (runtime/v2/runc/task), embedded in this shim: it mounts the rootfs,
// runs runc, owns stdio, exec, OOM events, stats and exit statuses, and
// publishes the task events itself. This shim routes a task's calls to
// it by id (plainRouter) and keeps only what is ours: the task record,
// and for the sandbox its pod bookkeeping. See docs/plain-containers.md.

// plainTask is a task the runc service runs.
type plainTask struct {
	bundle string
	// sandbox is the pod's bookkeeping (network, marker, record) when the
	// task is the pod's pause; nil for a plain container.
	sandbox *sandboxTask
}

// runcRuntime is the embedded runc task service, made once the config
// turned plain containers on.
type runcRuntime struct {
	once sync.Once
	svc  taskAPI.TaskService // nil until made
	err  error
}

// startRunc makes the runc task service at the shim's first Create with
// plain_containers on, before this shim started any child: from here
// on the shim reaps every child (SIGCHLD, as containerd's shims do with
// their reaper) and is the subreaper of what runc leaves behind, and
// its own helpers wait through that reaper (childproc). QEMU is
// libvirtd's child, not ours: its pidfd watch is unaffected.
func (s *service) startRunc(ctx context.Context) (taskAPI.TaskService, error) {
	s.runc.once.Do(func() {
		ctx = context.WithoutCancel(ctx)
		if err := reaper.SetSubreaper(1); err != nil {
			s.runc.err = fmt.Errorf("become the subreaper of runc containers: %w", err)
			return
		}
		sigs := make(chan os.Signal, 32)
		signal.Notify(sigs, unix.SIGCHLD)
		goSafe(ctx, "reap children", func() {
			for range sigs {
				if err := reaper.Reap(); err != nil {
					log.G(ctx).WithError(err).Error("reap exit status")
				}
			}
		})
		childproc.SetReaper(monitorReaper{})
		s.runc.svc, s.runc.err = runctask.NewTaskService(ctx, keepOpen{s.publisher}, s.shutdown)
		if s.runc.err == nil {
			log.G(ctx).Info("plain containers on: runc task service started, shim reaps its children")
		}
	})
	return s.runc.svc, s.runc.err
}

// keepOpen is the shim's event publisher as the runc task service gets
// it: that service closes its publisher once its own event channel is
// drained at shutdown, while the shim's event queue still drains into the
// same publisher and closes it itself (events.go); a second close could
// drop the queue's last events (a TaskDelete).
type keepOpen struct{ shim.Publisher }

func (keepOpen) Close() error { return nil }

// monitorReaper waits for a helper through containerd's reaper.
type monitorReaper struct{}

func (monitorReaper) Start(cmd *exec.Cmd) (func() (int, error), error) {
	ec, err := reaper.Default.Start(cmd)
	if err != nil {
		return nil, err
	}
	return func() (int, error) { return reaper.Default.Wait(cmd, ec) }, nil
}

// createPlain hands a plain container, or the pod's pause, to runc. The
// record comes first, so a cleanup after a crash finds the runc
// container; the runtime options are the shim's (a config path), not
// runc's, and stay here: runc runs with its defaults.
func (s *service) createPlain(ctx context.Context, r *taskAPI.CreateTaskRequest, req createRequest, stateDir string,
	rt taskRoute) (_ *taskAPI.CreateTaskResponse, retErr error) {
	rs, err := s.startRunc(ctx)
	if err != nil {
		return nil, err
	}
	ident := identity(ctx, r.ID, req.spec)
	pt := &plainTask{bundle: r.Bundle}
	if rt == routePauseSandbox {
		req.runc = true
		if pt.sandbox, err = createSandboxTask(ctx, layout{root: stateDir}, req, ident, s.events.send); err != nil {
			return nil, err
		}
	} else {
		rec := taskRecord{Kind: kindPlain, ID: r.ID, Namespace: ident.Namespace, PodUID: ident.PodUID, Runc: true}
		if err = writeRecord(r.Bundle, &rec); err != nil {
			return nil, fmt.Errorf("write task record: %w", err)
		}
	}
	defer func() {
		if retErr != nil {
			// A failed Create never removes the pod's data: a pod
			// re-created after a power loss keeps its VMs' disks for
			// kubelet's next try (faults.md).
			s.forgetPlain(ctx, r.ID, r.Bundle, pt, false)
		}
	}()
	fwd := &taskAPI.CreateTaskRequest{
		ID: r.ID, Bundle: r.Bundle, Rootfs: r.Rootfs, Terminal: r.Terminal,
		Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr,
	}
	resp, err := rs.Create(ctx, fwd)
	if err != nil {
		return nil, err
	}
	withLock(&s.mu, func() { s.plain[r.ID] = pt })
	log.G(ctx).WithField("id", r.ID).WithField("route", rt.String()).Info("created with runc")
	return resp, nil
}

// forgetPlain drops what the shim keeps of a runc task: the sandbox's
// pod bookkeeping and the record. removePod also removes the pod's data
// (its VMs' disks): only a deleted sandbox whose pod has no VM left asks
// for it.
func (s *service) forgetPlain(ctx context.Context, id, bundle string, pt *plainTask, removePod bool) {
	if pt.sandbox != nil {
		if err := releaseSandbox(ctx, pt.sandbox.layout, &pt.sandbox.rec, removePod); err != nil {
			log.G(ctx).WithError(err).WithField("sandbox", id).Warn("release the pod's sandbox")
		}
	}
	if err := removeRecord(bundle); err != nil {
		log.G(ctx).WithError(err).WithField("id", id).Warn("remove task record")
	}
}

// plainFor returns the runc service and the task when id is a runc task.
func (s *service) plainFor(id string) (taskAPI.TaskService, *plainTask) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pt, ok := s.plain[id]
	if !ok {
		return nil, nil
	}
	return s.runc.svc, pt
}

// deletePlain deletes a runc task, then what the shim kept for it.
func (s *service) deletePlain(ctx context.Context, rs taskAPI.TaskService, pt *plainTask,
	r *taskAPI.DeleteRequest) (*taskAPI.DeleteResponse, error) {
	resp, err := rs.Delete(ctx, r)
	if errdefs.IsNotFound(err) && r.ExecID == "" {
		// runc has no such container (any more): nothing keeps it, so
		// the shim must not either, or Shutdown would wait for it forever.
		withLock(&s.mu, func() { delete(s.plain, r.ID) })
		s.forgetPlain(ctx, r.ID, pt.bundle, pt, pt.sandbox != nil && !s.podHasVMs(pt.sandbox.rec.PodUID))
		return resp, err
	}
	if err != nil || r.ExecID != "" {
		return resp, err
	}
	withLock(&s.mu, func() { delete(s.plain, r.ID) })
	s.forgetPlain(ctx, r.ID, pt.bundle, pt, pt.sandbox != nil && !s.podHasVMs(pt.sandbox.rec.PodUID))
	return resp, nil
}

// stopRunc is the cleanup `delete` of a runc task whose shim died, as
// containerd's runc shim does it: force-delete the runc container (runc's
// default root, where the embedded service made it) and unmount the
// rootfs. Both may be gone already.
func stopRunc(ctx context.Context, ns, bundle, id string) int {
	r := process.NewRunc("", bundle, ns, "", false)
	if err := r.Delete(ctx, id, &runcC.DeleteOpts{Force: true}); err != nil {
		log.G(ctx).WithError(err).WithField("id", id).Warn("remove runc container")
	}
	if err := mount.UnmountRecursive(filepath.Join(bundle, "rootfs"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		log.G(ctx).WithError(err).WithField("id", id).Warn("unmount rootfs")
	}
	pid, _ := runcC.ReadPidFile(filepath.Join(bundle, process.InitPidFile))
	return pid
}
