// Command kvm-shim-installer installs, upgrades and removes
// containerd-shim-kvm-v1 on the node it runs on, from the node
// installer's DaemonSet (deploy/installer.yaml): `install` (the default)
// or `uninstall`. See docs/install-cluster.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/log"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/kubeapi"
	"github.com/kvm-shim/containerd-shim-kvm-v1/nodeinstall"
)

// options are the command line's.
type options struct {
	mode                         string
	layout                       nodeinstall.Layout
	node, containerdVersion      string
	restart, unit, pidFile, sock string
	eventNamespace, runtimeClass string
	force, once                  bool
	recheck                      time.Duration
}

func parse(args []string) (*options, error) {
	o := &options{mode: "install", layout: nodeinstall.DefaultLayout()}
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		o.mode, args = args[0], args[1:]
	}
	fs := flag.NewFlagSet("kvm-shim-installer "+o.mode, flag.ContinueOnError)
	l := &o.layout
	fs.StringVar(&l.HostRoot, "host-root", l.HostRoot, "where the node's root is mounted")
	fs.StringVar(&l.Payload, "payload", l.Payload, "the image's directory of binaries, default config and containerd snippets")
	fs.StringVar(&l.Prefix, "prefix", l.Prefix, "node path: the shim goes to PREFIX/bin (on containerd's PATH), the wrapper to PREFIX/libexec")
	fs.StringVar(&l.ShimConfig, "shim-config", l.ShimConfig, "node path of the shim's config (written when absent)")
	fs.StringVar(&l.ContainerdConfig, "containerd-config", l.ContainerdConfig, "node path of containerd's config.toml")
	fs.StringVar(&l.DropinDir, "dropin-dir", l.DropinDir, "node path of the directory containerd 2.x imports")
	fs.StringVar(&l.StateDir, "state-dir", l.StateDir, "node path of the installer's record of what it changed")
	fs.StringVar(&o.node, "node", os.Getenv("NODE_NAME"), "this node's name")
	fs.StringVar(&o.containerdVersion, "containerd-version", "", "containerd's version (default: what kubelet reports in the node's status)")
	fs.StringVar(&o.restart, "restart", "systemd", "how to restart containerd: systemd (the host's systemctl restart, chrooted; "+
		"needs hostPID) or pidfile (SIGTERM to the pid in -pid-file; a supervisor starts it again)")
	fs.StringVar(&o.unit, "systemd-unit", "containerd.service", "containerd's systemd unit")
	fs.StringVar(&o.pidFile, "pid-file", "/run/containerd/containerd.pid", "node path of containerd's pid file (-restart=pidfile)")
	fs.StringVar(&o.sock, "containerd-socket", "/run/containerd/containerd.sock",
		"node path of containerd's socket, waited for after a restart")
	fs.StringVar(&o.eventNamespace, "event-namespace", "default", "namespace of the events about the node")
	fs.StringVar(&o.runtimeClass, "runtime-class", "kvm", "comma-separated RuntimeClass names of VM pods (uninstall waits for them)")
	fs.BoolVar(&o.force, "force", false, "uninstall: do not wait for VM pods, and restore containerd's config even if changed since")
	fs.BoolVar(&o.once, "once", false, "exit after one run instead of staying up (a DaemonSet pod stays up)")
	fs.DurationVar(&o.recheck, "recheck", 5*time.Minute, "install: run again this often (check again, label or unlabel)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() != 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.mode != "install" && o.mode != "uninstall" {
		return nil, fmt.Errorf("mode %q: install or uninstall", o.mode)
	}
	if o.node == "" {
		return nil, errors.New("-node (or NODE_NAME) is required")
	}
	return o, nil
}

func (o *options) installer() (*nodeinstall.Installer, error) {
	kube, err := kubeapi.InCluster()
	if err != nil {
		return nil, err
	}
	host := func(p string) string { return filepath.Join(o.layout.HostRoot, p) }
	var r nodeinstall.Restarter
	switch o.restart {
	case "systemd":
		r = nodeinstall.SystemdRestarter{HostRoot: o.layout.HostRoot, Unit: o.unit, Socket: host(o.sock)}
	case "pidfile":
		r = nodeinstall.PidFileRestarter{PidFile: host(o.pidFile), Socket: host(o.sock)}
	default:
		return nil, fmt.Errorf("-restart %q: systemd or pidfile", o.restart)
	}
	return &nodeinstall.Installer{
		Layout: o.layout, Node: o.node, Kube: kube, Restart: r,
		Check:             nodeinstall.ChrootChecker{HostRoot: o.layout.HostRoot},
		ContainerdVersion: o.containerdVersion, EventNamespace: o.eventNamespace,
		Capacity: nodeinstall.HostCapacity{SysRoot: "/", ShimConfig: host(o.layout.ShimConfig)},
	}, nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil && !errors.Is(err, context.Canceled) {
		log.G(ctx).WithError(err).Error("kvm-shim-installer")
		os.Exit(1)
	}
}

// run does one install or uninstall and, unless -once, stays up: a
// DaemonSet pod that exited would be restarted. SIGTERM (the pod
// deleted, the DaemonSet rolled) only ends it; it never uninstalls.
func run(ctx context.Context, args []string) error {
	o, err := parse(args)
	if err != nil {
		return err
	}
	in, err := o.installer()
	if err != nil {
		return err
	}
	for {
		var res nodeinstall.Result
		if o.mode == "uninstall" {
			res, err = in.Uninstall(ctx, nodeinstall.UninstallOptions{RuntimeClasses: strings.Split(o.runtimeClass, ","), Force: o.force})
		} else {
			res, err = in.Install(ctx)
		}
		entry := log.G(ctx).WithField("mode", o.mode).WithField("wrote", res.Wrote).WithField("containerd_restarted", res.Restarted)
		if err != nil {
			entry.WithError(err).Error("failed; trying again later")
		} else {
			entry.WithField("labelled", res.Labelled).WithField("vcpu_capacity", res.VCPUCapacity).Info("done")
		}
		if o.once {
			return err
		}
		if o.mode == "uninstall" && err == nil {
			<-ctx.Done()
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(o.recheck):
		}
	}
}
