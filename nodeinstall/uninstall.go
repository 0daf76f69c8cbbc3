package nodeinstall

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/atomicfile"
)

// UninstallOptions tune a removal.
type UninstallOptions struct {
	// RuntimeClasses are the RuntimeClass names whose pods are VM pods
	// (default: kvm).
	RuntimeClasses []string
	// Force removes while VM pods still run on the node (they keep
	// running but their shim is gone: they cannot be stopped or deleted
	// cleanly until it is back), and restores containerd's configuration
	// even when someone changed it after the install.
	Force bool
	// Poll is how often the pods are listed again; 0 means 5 s.
	Poll time.Duration
}

// Uninstall removes the shim from the node: the label first (no new VM
// pod lands), then it waits while VM pods still run on the node, then
// withdraws the node's VM capacity, restores containerd's configuration byte for byte, restarts containerd
// once, and removes the binaries.
func (in *Installer) Uninstall(ctx context.Context, o UninstallOptions) (Result, error) {
	var res Result
	if err := in.Layout.validate(); err != nil {
		return res, err
	}
	if err := in.Kube.SetNodeLabel(ctx, in.Node, Label, nil); err != nil {
		return res, fmt.Errorf("unlabel node %s: %w", in.Node, err)
	}
	if err := in.waitVMPods(ctx, o); err != nil {
		return res, err
	}
	// Only once no VM pod runs: a kubelet restarted meanwhile would
	// admit its VM pods again against the resource.
	if err := in.withdraw(ctx); err != nil {
		return res, err
	}
	l := in.Layout
	rec, ok, err := l.loadRecord()
	if err != nil {
		return res, err
	}
	if !ok {
		log.G(ctx).WithField("record", l.recordPath()).Info("no install record: nothing of the installer's on this node")
		return res, nil
	}
	restored, err := l.restoreConfigs(rec, o.Force)
	res.Wrote = restored
	if err != nil {
		return res, err
	}
	if rec.RestartPending || len(restored) > 0 {
		log.G(ctx).WithField("paths", restored).Info("containerd's configuration restored: restarting containerd")
		if res.Restarted, err = in.restart(ctx, rec); err != nil {
			return res, err
		}
	}
	if err := l.removeFiles(rec); err != nil {
		return res, err
	}
	if err := os.Remove(l.recordPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return res, err
	}
	_ = os.Remove(l.host(l.StateDir)) // only when empty
	return res, nil
}

// waitVMPods returns once no pod of the VM runtime classes runs on the
// node, or at once with Force.
func (in *Installer) waitVMPods(ctx context.Context, o UninstallOptions) error {
	classes := o.RuntimeClasses
	if len(classes) == 0 {
		classes = []string{"kvm"}
	}
	poll := o.Poll
	if poll == 0 {
		poll = 5 * time.Second
	}
	for {
		pods, err := in.Kube.PodsOnNode(ctx, in.Node)
		if err != nil {
			return fmt.Errorf("list the pods on node %s: %w", in.Node, err)
		}
		var vms []string
		for _, p := range pods {
			if p.Status.Phase == "Succeeded" || p.Status.Phase == "Failed" {
				continue
			}
			for _, c := range classes {
				if p.Spec.RuntimeClassName == c {
					vms = append(vms, p.Metadata.Namespace+"/"+p.Metadata.Name)
				}
			}
		}
		if len(vms) == 0 {
			return nil
		}
		sort.Strings(vms)
		if o.Force {
			log.G(ctx).WithField("pods", vms).Warn("removing with VM pods still on the node (--force): " +
				"they keep running, but cannot be stopped cleanly until the shim is back")
			return nil
		}
		log.G(ctx).WithField("pods", vms).WithField("node", in.Node).
			Infof("waiting: %d VM pod(s) still run on this node; delete or drain them, or uninstall with --force", len(vms))
		select {
		case <-ctx.Done():
			return fmt.Errorf("VM pods still on node %s: %s: %w", in.Node, strings.Join(vms, ", "), ctx.Err())
		case <-time.After(poll):
		}
	}
}

// restoreConfigs puts every containerd configuration file back as it was
// before the first install. A file changed since the installer wrote it
// is refused (unless force): restoring it would drop someone's change.
func (l Layout) restoreConfigs(rec *record, force bool) ([]string, error) {
	paths := make([]string, 0, len(rec.Originals))
	for p := range rec.Originals {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		have, exists, err := readOptional(l.host(p))
		if err != nil {
			return nil, err
		}
		o := rec.Originals[p]
		restoredAlready := o.Exists == exists && bytes.Equal(have, o.Data)
		if !force && exists && !restoredAlready && digest(have) != rec.Written[p] {
			return nil, fmt.Errorf("%s changed since the installer wrote it; restore it by hand or uninstall with --force "+
				"(which puts back the original), nothing changed: %w", p, errdefs.ErrFailedPrecondition)
		}
	}
	var restored []string
	for _, p := range paths {
		o := rec.Originals[p]
		have, exists, err := readOptional(l.host(p))
		if err != nil {
			return restored, err
		}
		if o.Exists == exists && bytes.Equal(have, o.Data) {
			continue
		}
		if !rec.RestartPending { // before the first write: a crash still restarts
			rec.RestartPending = true
			if serr := l.saveRecord(rec); serr != nil {
				return restored, serr
			}
		}
		switch {
		case o.Exists:
			perm := o.Mode
			if perm == 0 {
				perm = 0o644
			}
			err = atomicfile.WriteFile(l.host(p), o.Data, atomicfile.Options{Perm: perm, Durability: atomicfile.SyncAll})
		default:
			err = os.Remove(l.host(p))
		}
		if err != nil {
			return restored, err
		}
		restored = append(restored, p)
	}
	return restored, nil
}
