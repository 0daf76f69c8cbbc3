package shim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/atomicfile"
	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/procfs"
	"github.com/kvm-shim/containerd-shim-kvm-v1/netfd"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vmplan"
)

// sandboxTask is the pod's sandbox ("pause") container. No VM runs for
// it: the shim records the pod's network namespace and metadata, and its
// pid is the shim's own, a live host pid as CRI needs. With
// plain_containers on, runc runs a real pause process for it
// (plain.go) and this keeps only the pod's bookkeeping.
type sandboxTask struct {
	proc
	rec    taskRecord
	layout layout
	netns  string
	// podNet is the pod network as CNI left it before the sandbox was
	// created; a VM container must find the same. nil: not read.
	podNet *netfd.PodNetwork
}

func createSandboxTask(ctx context.Context, l layout, r createRequest, ident vmplan.Identity, publish func(any)) (*sandboxTask, error) {
	t := &sandboxTask{
		proc:   newProc(r.id, r.bundle, r.stdio, publish),
		layout: l,
		netns:  netnsPath(r.spec),
		rec: taskRecord{
			Kind: kindSandbox, ID: r.id, Namespace: ident.Namespace,
			StateDir: l.root, PodUID: ident.PodUID, Pid: os.Getpid(),
		},
	}
	if r.runc {
		// The pause's pid is runc's to report.
		t.rec.Pid, t.rec.Runc = 0, true
	}
	if err := l.ensure(); err != nil {
		return nil, err
	}
	// CRI runs CNI before it creates the sandbox: what the namespace
	// holds now is the pod's network. A namespace the VM could not take
	// is reported when a VM container is created, not here.
	if t.netns != "" {
		if pn, err := netfd.Inspect(t.netns); err == nil {
			t.podNet, t.rec.PodNetwork = &pn, &pn
		} else {
			log.G(ctx).WithError(err).WithField("sandbox", r.id).Warn("pod network not recorded; VM containers will not check it for changes")
		}
	}
	if err := writeRecord(r.bundle, &t.rec); err != nil {
		return nil, fmt.Errorf("write task record: %w", err)
	}
	if t.rec.PodUID != "" {
		if err := writeMarker(l.sandboxMarker(t.rec.PodUID, r.id)); err != nil {
			_ = removeRecord(r.bundle)
			return nil, err
		}
	}
	return t, nil
}

func netnsPath(spec *specs.Spec) string {
	if spec.Linux == nil {
		return ""
	}
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			return ns.Path
		}
	}
	return ""
}

func (t *sandboxTask) start(ctx context.Context) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.allowLocked(stepStart); err != nil {
		return 0, err
	}
	t.setRunningLocked(os.Getpid())
	log.G(ctx).WithField("sandbox", t.id).WithField("netns", t.netns).Info("sandbox started")
	return t.pid, nil
}

// kill ends the sandbox as a pause process would: 0 for SIGTERM or
// SIGINT, 128+signal otherwise.
func (t *sandboxTask) kill(ctx context.Context, sig uint32) error {
	status := 128 + sig
	if s := unix.Signal(sig); s == unix.SIGTERM || s == unix.SIGINT {
		status = 0
	}
	if !t.setExited(status) {
		return fmt.Errorf("kill %s: process already finished: %w", t.id, errdefs.ErrNotFound)
	}
	return nil
}

func (t *sandboxTask) pause(context.Context) error {
	return fmt.Errorf("pause sandbox %s: %w", t.id, errdefs.ErrNotImplemented)
}

func (t *sandboxTask) resume(context.Context) error {
	return fmt.Errorf("resume sandbox %s: %w", t.id, errdefs.ErrNotImplemented)
}

// delete drops this sandbox's marker and, when no other live sandbox of
// the pod remains and no VM of the pod is left in this shim, the pod's
// data: the pod is gone.
func (t *sandboxTask) delete(ctx context.Context, podBusy bool) error {
	if err := t.deleteStopped(); err != nil {
		return err
	}
	if err := releaseSandbox(ctx, t.layout, &t.rec, !podBusy); err != nil {
		return err
	}
	return removeRecord(t.bundle)
}

// releaseSandbox removes the sandbox's marker. With removePod it also
// removes the pod's data if no other live sandbox of the pod is left. The
// cleanup `delete` after a shim died never removes pod data: after a node
// reboot the pod's new sandbox must find its VMs' disks.
func releaseSandbox(ctx context.Context, l layout, rec *taskRecord, removePod bool) error {
	if rec.PodUID == "" {
		return nil
	}
	if err := os.Remove(l.sandboxMarker(rec.PodUID, rec.ID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove sandbox marker: %w", err)
	}
	if !removePod {
		return nil
	}
	markers, _ := filepath.Glob(filepath.Join(l.podDir(rec.PodUID), "sandboxes", "*"))
	for _, m := range markers {
		if markerAlive(m) {
			return nil
		}
		_ = os.Remove(m) // left by a sandbox whose shim is gone
	}
	log.G(ctx).WithField("pod", rec.PodUID).Info("last sandbox of the pod deleted; removing the pod's VM data")
	return os.RemoveAll(l.podDir(rec.PodUID))
}

// A marker names the shim process that owns the sandbox, by pid and start
// time, so a marker left by a dead shim is recognised even if the pid was
// reused.
type marker struct {
	Pid       int    `json:"pid"`
	StartTime uint64 `json:"startTime"`
}

func writeMarker(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("create sandbox marker dir: %w", err)
	}
	st, err := procfs.StartTime(os.Getpid())
	if err != nil {
		return err
	}
	b, _ := json.Marshal(marker{Pid: os.Getpid(), StartTime: st})
	// A marker names a live shim process: after a power loss it names
	// none, whatever it says, so only a whole file matters (synced data).
	if err := atomicfile.WriteFile(path, b, atomicfile.Options{Perm: 0o600, Durability: atomicfile.SyncData}); err != nil {
		return fmt.Errorf("write sandbox marker: %w", err)
	}
	return nil
}

func markerAlive(path string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	var m marker
	if json.Unmarshal(b, &m) != nil {
		return false
	}
	return !procfs.Gone(m.Pid, m.StartTime)
}
