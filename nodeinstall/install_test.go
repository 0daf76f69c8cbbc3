package nodeinstall

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/kubeapi"
)

const (
	configV2 = `version = 2
root = "/var/lib/containerd"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/pause:1"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
`
	// The CRI containerd table is there: the runc runtime goes in
	// without a second header of it.
	configV2Table = `version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
`
	configV3 = `version = 3
[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dir = "/usr/lib/cni"
`
)

func TestFreshInstall(t *testing.T) {
	for _, tc := range []struct {
		name, containerd, config string
		// files the runtime configuration is in afterwards
		files []string
	}{
		{"containerd 1.6", "containerd://1.6.20", configV2, []string{"/etc/containerd/config.toml"}},
		{"containerd 1.7, CRI table declared", "containerd://1.7.24", configV2Table, []string{"/etc/containerd/config.toml"}},
		{"containerd 1.6, no config.toml", "containerd://1.6.20", "", []string{"/etc/containerd/config.toml"}},
		{"containerd 2.x", "containerd://2.2.1", configV3,
			[]string{"/etc/containerd/conf.d/containerd-shim-kvm-v1.toml", "/etc/containerd/config.toml"}},
		{"containerd 2.x, no config.toml", "containerd://2.1.0", "", []string{"/etc/containerd/conf.d/containerd-shim-kvm-v1.toml"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, tc.containerd)
			if tc.config != "" {
				r.hostFile(t, "/etc/containerd/config.toml", tc.config)
			}
			res, err := r.in.Install(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if !res.Labelled || r.restart.n != 1 {
				t.Fatalf("labelled %v, restarts %d; want a label and one restart", res.Labelled, r.restart.n)
			}
			if v, _ := r.api.label(); v != LabelValue {
				t.Fatalf("node label %q, want %q", v, LabelValue)
			}
			if got := r.read(t, r.in.Layout.ShimPath()); got != "shim N" {
				t.Fatalf("shim %q", got)
			}
			cfg := r.read(t, r.in.Layout.ShimConfig)
			if !strings.Contains(cfg, `qemu_wrapper = "/usr/local/libexec/containerd-shim-kvm-v1/kvm-qemu-wrapper"`) {
				t.Fatalf("shim config does not name the installed wrapper:\n%s", cfg)
			}
			assertRuntimeDeclared(t, r, tc.containerd, tc.files)
			if len(r.check.reqs) != 1 || r.check.reqs[0].Shim != "/usr/local/bin/containerd-shim-kvm-v1" {
				t.Fatalf("check requests %+v", r.check.reqs)
			}
		})
	}
}

// assertRuntimeDeclared merges the files as containerd would (later
// ones key by key over earlier ones) and looks for the kvm and runc
// runtimes and, before 2.0, the operator's settings kept.
func assertRuntimeDeclared(t *testing.T, r *rig, containerd string, files []string) {
	t.Helper()
	v, err := ConfigVersionOf(containerd)
	must(t, err)
	found := map[string]bool{}
	for _, f := range files {
		b := r.read(t, f)
		m, err := parseConfig(f, []byte(b))
		if err != nil {
			t.Fatalf("%s does not parse: %v\n%s", f, err, b)
		}
		for _, rt := range []string{"kvm", "runc"} {
			found[rt] = found[rt] || declaresRuntime(m, v, rt)
		}
		if f == "/etc/containerd/config.toml" && v == 3 && !importsPath(m["imports"], r.in.Layout.DropinPath()) {
			t.Fatalf("%s does not import the drop-in:\n%s", f, b)
		}
	}
	if !found["kvm"] {
		t.Fatalf("no kvm runtime in %v", files)
	}
	if v == 2 && !found["runc"] {
		t.Fatalf("containerd 1.x config without a runc runtime: CRI would not start")
	}
}

func TestRerunChangesNothing(t *testing.T) {
	for _, ctd := range []string{"containerd://1.6.20", "containerd://2.2.1"} {
		t.Run(ctd, func(t *testing.T) {
			r := newRig(t, ctd)
			r.hostFile(t, "/etc/containerd/config.toml", map[bool]string{true: configV2, false: configV3}[strings.Contains(ctd, "//1.")])
			if _, err := r.in.Install(context.Background()); err != nil {
				t.Fatal(err)
			}
			before := snapshot(t, r.in.Layout.HostRoot)
			patches := r.api.patches
			for i := 0; i < 2; i++ { // the pod restarted, the DaemonSet re-applied
				res, err := r.in.Install(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if len(res.Wrote) != 0 || res.Restarted {
					t.Fatalf("run %d wrote %v, restarted %v; want nothing", i+2, res.Wrote, res.Restarted)
				}
			}
			sameSnapshot(t, "re-run", before, snapshot(t, r.in.Layout.HostRoot))
			if r.restart.n != 1 || r.api.patches != patches {
				t.Fatalf("restarts %d (want the first install's only), label patches %d -> %d", r.restart.n, patches, r.api.patches)
			}
		})
	}
}

func TestConfigChangeRestartsOnce(t *testing.T) {
	r := newRig(t, "containerd://2.2.1")
	if _, err := r.in.Install(context.Background()); err != nil {
		t.Fatal(err)
	}
	// N+1 with new binaries only: no restart.
	writePayload(t, r.in.Layout.Payload, "shim N+1", "wrapper N+1")
	if res, err := r.in.Install(context.Background()); err != nil || res.Restarted {
		t.Fatalf("binaries only: restarted %v, err %v", res.Restarted, err)
	}
	// N+2 changes the runtime configuration: one restart.
	snippet := filepath.Join(r.in.Layout.Payload, "containerd", "containerd-v3.toml")
	b, err := os.ReadFile(snippet)
	must(t, err)
	changed := strings.Replace(string(b), `pod_annotations = ["kvm.containerd.io/*"]`,
		`pod_annotations = ["kvm.containerd.io/*", "io.kubernetes.cri.*"]`, 1)
	if changed == string(b) {
		t.Fatal("deploy/deb/containerd-v3.toml has no pod_annotations line to change")
	}
	must(t, os.WriteFile(snippet, []byte(changed), 0o644))
	res, err := r.in.Install(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !res.Restarted || r.restart.n != 2 {
		t.Fatalf("configuration changed: restarted %v, restarts %d; want one more", res.Restarted, r.restart.n)
	}
	if res, _ := r.in.Install(context.Background()); res.Restarted {
		t.Fatal("restarted again with nothing changed")
	}
}

func TestCheckFailingLeavesNodeUnlabelled(t *testing.T) {
	r := newRig(t, "containerd://1.6.20")
	r.hostFile(t, "/etc/containerd/config.toml", configV2)
	if _, err := r.in.Install(context.Background()); err != nil {
		t.Fatal(err)
	}
	// libvirtd goes away: the next run takes the label back.
	r.check.fail = []string{"libvirt", "state dir"}
	_, err := r.in.Install(context.Background())
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "libvirt, state dir") {
		t.Fatalf("error %v; want a failed precondition naming the checks", err)
	}
	if v, ok := r.api.label(); ok {
		t.Fatalf("node still labelled %q", v)
	}
	if len(r.api.events) != 1 {
		t.Fatalf("events %+v; want one", r.api.events)
	}
	e := r.api.events[0]
	if e.Reason != "KvmShimCheckFailed" || e.InvolvedObject.Kind != "Node" || e.InvolvedObject.Name != "node-a" ||
		e.InvolvedObject.UID != "uid-1" || !strings.Contains(e.Message, "libvirt") || !strings.Contains(e.Message, "state dir") {
		t.Fatalf("event %+v", e)
	}
}

func TestBadInputChangesNothing(t *testing.T) {
	for _, tc := range []struct {
		name, containerd, config string
		class                    error
	}{
		{"unparseable config", "containerd://1.6.20", "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"\n", errdefs.ErrInvalidArgument},
		{"unparseable config, 2.x", "containerd://2.2.1", "version = 3\nimports = [\n", errdefs.ErrInvalidArgument},
		{"version 1 config on 1.6", "containerd://1.6.20", "[plugins.cri]\n", errdefs.ErrFailedPrecondition},
		{"version 2 config on 2.x", "containerd://2.2.1", configV2, errdefs.ErrFailedPrecondition},
		{"imports without conf.d", "containerd://2.2.1", "version = 3\nimports = [\"/etc/other/*.toml\"]\n", errdefs.ErrFailedPrecondition},
		{"kvm runtime of someone else", "containerd://1.7.1",
			configV2 + "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.kvm]\n", errdefs.ErrAlreadyExists},
		{"containerd 1.5", "containerd://1.5.9", configV2, errdefs.ErrNotImplemented},
		{"containerd 3.0", "containerd://3.0.0", configV3, errdefs.ErrNotImplemented},
		{"not containerd", "cri-o://1.30.0", configV2, errdefs.ErrNotImplemented},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, tc.containerd)
			r.hostFile(t, "/etc/containerd/config.toml", tc.config)
			before := snapshot(t, r.in.Layout.HostRoot)
			_, err := r.in.Install(context.Background())
			if !errors.Is(err, tc.class) {
				t.Fatalf("error %v; want %v", err, tc.class)
			}
			sameSnapshot(t, tc.name, before, snapshot(t, r.in.Layout.HostRoot))
			if r.restart.n != 0 || len(r.check.reqs) != 0 {
				t.Fatalf("restarts %d, checks %d; want none", r.restart.n, len(r.check.reqs))
			}
			if _, ok := r.api.label(); ok {
				t.Fatal("node labelled")
			}
			if len(r.api.events) != 1 || r.api.events[0].Reason != "KvmShimInstallFailed" {
				t.Fatalf("events %+v; want one KvmShimInstallFailed", r.api.events)
			}
		})
	}
}

func TestUninstallRestoresBytes(t *testing.T) {
	for _, tc := range []struct{ name, containerd, config string }{
		{"1.6", "containerd://1.6.20", configV2},
		{"1.6, no config.toml", "containerd://1.6.20", ""},
		{"2.x", "containerd://2.2.1", configV3},
		{"2.x, config imports conf.d", "containerd://2.2.1", "imports = [\"/etc/containerd/conf.d/*.toml\"]\nversion = 3\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, tc.containerd)
			if tc.config != "" {
				r.hostFile(t, "/etc/containerd/config.toml", tc.config)
				must(t, os.Chmod(r.in.Layout.host("/etc/containerd/config.toml"), 0o600))
			}
			before := snapshot(t, r.in.Layout.HostRoot)
			if _, err := r.in.Install(context.Background()); err != nil {
				t.Fatal(err)
			}
			res, err := r.in.Uninstall(context.Background(), UninstallOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !res.Restarted || r.restart.n != 2 {
				t.Fatalf("uninstall restarted %v, restarts %d; want one each", res.Restarted, r.restart.n)
			}
			sameSnapshot(t, "after uninstall", before, snapshot(t, r.in.Layout.HostRoot))
			if _, ok := r.api.label(); ok {
				t.Fatal("node still labelled")
			}
			// Uninstalling again finds nothing to do.
			if res, err := r.in.Uninstall(context.Background(), UninstallOptions{}); err != nil || res.Restarted {
				t.Fatalf("second uninstall: %+v, %v", res, err)
			}
		})
	}
}

func TestUninstallWaitsForVMPods(t *testing.T) {
	r := newRig(t, "containerd://2.2.1")
	if _, err := r.in.Install(context.Background()); err != nil {
		t.Fatal(err)
	}
	pod := func(name, class, phase string) kubeapi.Pod {
		var p kubeapi.Pod
		p.Metadata.Name, p.Metadata.Namespace = name, "default"
		p.Spec.NodeName, p.Spec.RuntimeClassName, p.Status.Phase = "node-a", class, phase
		return p
	}
	r.api.pods = []kubeapi.Pod{pod("vm-1", "kvm", "Running"), pod("web", "", "Running"), pod("vm-done", "kvm", "Succeeded")}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := r.in.Uninstall(ctx, UninstallOptions{Poll: 50 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "default/vm-1") || strings.Contains(err.Error(), "web") ||
		strings.Contains(err.Error(), "vm-done") {
		t.Fatalf("error %v; want one naming default/vm-1 only", err)
	}
	if _, ok := r.api.label(); ok {
		t.Fatal("label kept while waiting: new VM pods would land")
	}
	if r.restart.n != 1 || r.read(t, r.in.Layout.ShimPath()) != "shim N" {
		t.Fatal("removed something while a VM pod runs")
	}
	res, err := r.in.Uninstall(context.Background(), UninstallOptions{Force: true})
	if err != nil || !res.Restarted {
		t.Fatalf("forced uninstall: %+v, %v", res, err)
	}
	if _, err := os.Stat(r.in.Layout.host(r.in.Layout.ShimPath())); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("shim left after a forced uninstall: %v", err)
	}
}

func TestUninstallRefusesAChangedConfig(t *testing.T) {
	r := newRig(t, "containerd://1.6.20")
	r.hostFile(t, "/etc/containerd/config.toml", configV2)
	if _, err := r.in.Install(context.Background()); err != nil {
		t.Fatal(err)
	}
	changed := r.read(t, "/etc/containerd/config.toml") + "# the operator's\n"
	r.hostFile(t, "/etc/containerd/config.toml", changed)
	if _, err := r.in.Uninstall(context.Background(), UninstallOptions{}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("error %v; want a refusal", err)
	}
	if r.read(t, "/etc/containerd/config.toml") != changed || r.restart.n != 1 {
		t.Fatal("the refusal changed something")
	}
	if _, err := r.in.Uninstall(context.Background(), UninstallOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	if got := r.read(t, "/etc/containerd/config.toml"); got != configV2 {
		t.Fatalf("forced uninstall left:\n%s", got)
	}
}

// TestUpgradeDowngradeReplaceAtomically: a running shim's binary is
// never written to; the path gets a new file, and nothing else is left
// in the directory.
func TestUpgradeDowngradeReplaceAtomically(t *testing.T) {
	r := newRig(t, "containerd://2.2.1")
	if _, err := r.in.Install(context.Background()); err != nil {
		t.Fatal(err)
	}
	shim := r.in.Layout.host(r.in.Layout.ShimPath())
	for i, v := range []string{"N+1", "N"} {
		running, err := os.Open(shim) // a shim of the version before
		must(t, err)
		var st syscall.Stat_t
		must(t, syscall.Fstat(int(running.Fd()), &st))
		prev := "shim N"
		if i == 1 {
			prev = "shim N+1"
		}
		writePayload(t, r.in.Layout.Payload, "shim "+v, "wrapper "+v)
		res, err := r.in.Install(context.Background())
		must(t, err)
		if res.Restarted {
			t.Fatal("binaries alone restarted containerd")
		}
		b := make([]byte, 64)
		n, _ := running.ReadAt(b, 0)
		running.Close()
		if string(b[:n]) != prev {
			t.Fatalf("to %s: the running shim's file now reads %q: modified in place", v, b[:n])
		}
		var now syscall.Stat_t
		must(t, syscall.Stat(shim, &now))
		if now.Ino == st.Ino {
			t.Fatalf("to %s: same inode: written in place", v)
		}
		if got := r.read(t, r.in.Layout.ShimPath()); got != "shim "+v {
			t.Fatalf("to %s: shim reads %q", v, got)
		}
		entries, err := os.ReadDir(filepath.Dir(shim))
		must(t, err)
		if len(entries) != 1 {
			t.Fatalf("to %s: %v in the bin dir; want the shim only", v, entries)
		}
	}
}

func TestConfigVersionOf(t *testing.T) {
	for in, want := range map[string]ConfigVersion{
		"containerd://1.6.20": 2, "1.7.0": 2, "v1.7.24-1": 2, "containerd://2.0.0": 3, "2.2.1": 3, "v2.1.0-rc.1": 3,
		"containerd://1.5.9": 0, "3.0.0": 0, "containerd://": 0, "banana": 0,
	} {
		got, err := ConfigVersionOf(in)
		if got != want || (want == 0) != (err != nil) {
			t.Errorf("ConfigVersionOf(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
}

func TestFailedChecks(t *testing.T) {
	out := "ok    config        accel=auto\nFAIL  libvirt       dial: no such file\n" +
		"FAIL  state dir     mkdir: read-only\nwarn  vhost-net     missing\nFAIL  cgroups\n"
	got := strings.Join(FailedChecks(out), ",")
	if got != "libvirt,state dir,cgroups" {
		t.Fatalf("FailedChecks = %q", got)
	}
}

// failingRestarter fails its first restart, as a containerd that does not
// come back in time.
type failingRestarter struct{ calls, fails int }

func (r *failingRestarter) Restart(context.Context) error {
	r.calls++
	if r.calls <= r.fails {
		return errors.New("containerd did not come back")
	}
	return nil
}

// TestFailedRestartIsRetried: the configuration is written but the
// restart fails; the next run (config now unchanged) still restarts, and
// only once.
func TestFailedRestartIsRetried(t *testing.T) {
	for _, mode := range []string{"install", "uninstall"} {
		t.Run(mode, func(t *testing.T) {
			r := newRig(t, "containerd://2.2.1")
			r.hostFile(t, "/etc/containerd/config.toml", configV3)
			fr := &failingRestarter{}
			r.in.Restart = fr
			run := func() (Result, error) {
				if mode == "install" {
					return r.in.Install(context.Background())
				}
				return r.in.Uninstall(context.Background(), UninstallOptions{})
			}
			if mode == "uninstall" {
				if _, err := r.in.Install(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			fr.calls, fr.fails = 0, 1
			if _, err := run(); err == nil {
				t.Fatal("a failed restart was not reported")
			}
			res, err := run()
			if err != nil || !res.Restarted || fr.calls != 2 {
				t.Fatalf("rerun after a failed restart: %+v, %v, restarts tried %d; want one more", res, err, fr.calls)
			}
			if res, err := run(); err != nil || res.Restarted || fr.calls != 2 {
				t.Fatalf("third run: %+v, %v, restarts tried %d; want none", res, err, fr.calls)
			}
		})
	}
}
