package nodeinstall

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/atomicfile"
	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/kubeapi"
)

// Installer installs or removes the shim on one node.
type Installer struct {
	Layout Layout
	// Node is this node's name (the pod's spec.nodeName).
	Node string
	Kube *kubeapi.Client
	// Restart restarts containerd; Check runs the shim's check.
	Restart Restarter
	Check   Checker
	// ContainerdVersion overrides the version kubelet reports for the
	// node ("1.7.22", "2.1.0"); empty trusts the node's nodeInfo.
	ContainerdVersion string
	// EventNamespace is where events about the node are recorded.
	EventNamespace string
	// Capacity gives the node's VM capacity, advertised as the extended
	// resource numa.VCPUResource once check passes and withdrawn at
	// uninstall; nil advertises nothing.
	Capacity CapacityReader
}

// Result says what an install or uninstall did.
type Result struct {
	// Wrote lists the node paths written or removed.
	Wrote []string
	// Restarted: containerd was restarted (once).
	Restarted bool
	Check     CheckResult
	Labelled  bool
	// VCPUCapacity is the numa.VCPUResource advertised.
	VCPUCapacity int64
}

// Install brings the node to the payload's version: it plans first
// (reading only; any refusal leaves the node as it was and is recorded
// as an event), then places the binaries, then the containerd
// configuration, restarts containerd if and only if that configuration
// changed, runs check and, when it passes, advertises the node's VM
// capacity and labels the node.
func (in *Installer) Install(ctx context.Context) (Result, error) {
	node, err := in.Kube.GetNode(ctx, in.Node)
	if err != nil {
		return Result{}, fmt.Errorf("read node %s: %w", in.Node, err)
	}
	res, err := in.install(ctx, node)
	if err != nil {
		in.event(ctx, node, "KvmShimInstallFailed", err.Error())
		return res, err
	}
	if !res.Check.Passed {
		msg := "containerd-shim-kvm-v1 check failed: " + strings.Join(res.Check.Failed, ", ")
		if len(res.Check.Failed) == 0 {
			msg = "containerd-shim-kvm-v1 check failed: " + lastLines(res.Check.Output, 3)
		}
		if err := in.Kube.SetNodeLabel(ctx, in.Node, Label, nil); err != nil {
			return res, fmt.Errorf("unlabel node %s: %w", in.Node, err)
		}
		in.event(ctx, node, "KvmShimCheckFailed", msg)
		return res, fmt.Errorf("%s: %w", msg, errdefs.ErrFailedPrecondition)
	}
	// The capacity before the label: the scheduler never sees a
	// labelled node without it.
	capacity, advErr := in.advertise(ctx)
	if advErr != nil {
		in.event(ctx, node, "KvmShimInstallFailed", advErr.Error())
		return res, advErr
	}
	res.VCPUCapacity = capacity
	if node.Metadata.Labels[Label] != LabelValue {
		v := LabelValue
		if err := in.Kube.SetNodeLabel(ctx, in.Node, Label, &v); err != nil {
			return res, fmt.Errorf("label node %s: %w", in.Node, err)
		}
	}
	res.Labelled = true
	return res, nil
}

func (in *Installer) install(ctx context.Context, node *kubeapi.Node) (Result, error) {
	var res Result
	l := in.Layout
	if err := l.validate(); err != nil {
		return res, err
	}
	version := in.ContainerdVersion
	if version == "" {
		version = node.Status.NodeInfo.ContainerRuntimeVersion
		if !strings.HasPrefix(version, "containerd://") {
			return res, fmt.Errorf("node %s runs %q, not containerd: %w", in.Node, version, errdefs.ErrNotImplemented)
		}
	}
	cv, err := ConfigVersionOf(version)
	if err != nil {
		return res, err
	}
	// Plan: everything read and refused before anything is written.
	p, err := l.readPayload()
	if err != nil {
		return res, err
	}
	configs, err := l.planConfig(cv)
	if err != nil {
		return res, err
	}
	rec, _, err := l.loadRecord()
	if err != nil {
		return res, err
	}
	if res.Wrote, err = in.apply(ctx, p, configs, rec); err != nil {
		return res, err
	}
	if rec.RestartPending {
		log.G(ctx).WithField("containerd_version", version).Info("containerd's runtime configuration changed: restarting containerd")
		if res.Restarted, err = in.restart(ctx, rec); err != nil {
			return res, err
		}
	}
	res.Check, err = in.Check.Check(ctx, CheckRequest{Shim: l.ShimPath(), ShimConfig: l.ShimConfig, ContainerdConfig: l.ContainerdConfig})
	return res, err
}

// apply writes what planConfig and readPayload decided, recording each
// configuration file's original before its first change.
func (in *Installer) apply(ctx context.Context, p *payload, configs []configFile, rec *record) ([]string, error) {
	l := in.Layout
	for _, c := range configs {
		if _, kept := rec.Originals[c.path]; kept || !c.changed() {
			continue
		}
		o := original{Exists: c.haveExists, Data: c.have}
		if fi, err := os.Stat(l.host(c.path)); err == nil {
			o.Mode = fi.Mode().Perm()
		}
		rec.Originals[c.path] = o
	}
	for _, c := range configs {
		rec.RestartPending = rec.RestartPending || c.changed()
	}
	// The record first: a crash after a config write still finds it.
	if err := l.saveRecord(rec); err != nil {
		return nil, err
	}
	wrote, err := l.installFiles(p, rec)
	if err != nil {
		return wrote, errors.Join(err, l.saveRecord(rec))
	}
	for _, c := range configs {
		if !c.changed() {
			continue
		}
		perm := os.FileMode(0o644)
		if o, ok := rec.Originals[c.path]; ok && o.Mode != 0 {
			perm = o.Mode
		}
		if err := os.MkdirAll(l.host(dirOf(c.path)), 0o755); err != nil {
			return wrote, err
		}
		if err := atomicfile.WriteFile(l.host(c.path), c.want, atomicfile.Options{Perm: perm, Durability: atomicfile.SyncAll}); err != nil {
			return wrote, errors.Join(err, l.saveRecord(rec))
		}
		rec.Written[c.path] = digest(c.want)
		wrote = append(wrote, c.path)
	}
	for _, w := range wrote {
		log.G(ctx).WithField("path", w).Info("wrote")
	}
	return wrote, l.saveRecord(rec)
}

// restart restarts containerd and clears the record's pending restart.
func (in *Installer) restart(ctx context.Context, rec *record) (bool, error) {
	if err := in.Restart.Restart(ctx); err != nil {
		return false, err
	}
	rec.RestartPending = false
	return true, in.Layout.saveRecord(rec)
}

// event records an event about the node; failing to is logged, not
// returned: the error it reports is returned already.
func (in *Installer) event(ctx context.Context, node *kubeapi.Node, reason, msg string) {
	now := time.Now().UTC().Truncate(time.Second)
	e := &kubeapi.Event{
		Metadata: kubeapi.ObjectMeta{Name: fmt.Sprintf("%s.%x", in.Node, time.Now().UnixNano())},
		InvolvedObject: kubeapi.ObjectReference{
			Kind: "Node", APIVersion: "v1", Name: in.Node, UID: node.Metadata.UID,
		},
		Reason: reason, Message: msg, Type: "Warning",
		Source:         kubeapi.EventSource{Component: "kvm-shim-installer", Host: in.Node},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	if err := in.Kube.CreateEvent(ctx, in.EventNamespace, e); err != nil {
		log.G(ctx).WithError(err).WithField("reason", reason).Warn("could not record an event")
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "; ")
}
