//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/kube"
	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// The two installer images the test builds: version N and N+1, whose
// shims differ in their version string.
var installerVersions = []string{"e2e-1", "e2e-2"}

const installerImage = "localhost/kvm-shim-installer"

// installerEnv is a node without the shim: containerd's config has no
// kvm runtime and its PATH starts with the empty directory the
// installer puts the shim in.
type installerEnv struct {
	*env
	prefix, dropinDir, stateDir, pidFile string
	original                             []byte // containerd's config before the install
	restarts                             atomic.Int32
	stopSupervisor                       func()
	node2                                *secondNode // a node without the shim
}

// TestInstaller takes the node installer's DaemonSet through install, a
// pod restart, an upgrade N -> N+1 and a downgrade with a VM pod running,
// and uninstall, on each containerd flavour. Its cluster runs
// kube-scheduler and has a second node without the shim, which the
// DaemonSet leaves alone: VM pods are scheduled to the first node only,
// runc pods to both.
func TestInstaller(t *testing.T) {
	if skipReason != "" {
		t.Skip(skipReason)
	}
	archives := suite.buildInstallerImages(t)
	for _, name := range strings.Split(envOr("KVM_IT_FLAVOURS", "1.6,2.x"), ",") {
		name = strings.TrimSpace(name)
		t.Run(name, func(t *testing.T) {
			ie := suite.startBare(t, name, archives)
			testInstallUpgradeRemove(t, ie)
		})
	}
}

// buildInstallerImages builds the shim, wrapper and installer for each
// version and packs each image with deploy/image.sh, as make deploy-image
// does.
func (s *testSuite) buildInstallerImages(t *testing.T) []string {
	t.Helper()
	var archives []string
	for _, v := range installerVersions {
		bin := filepath.Join(s.tmp, "deploy-"+v, "bin")
		for _, b := range []struct{ out, pkg, ldflags string }{
			{"containerd-shim-kvm-v1", "./cmd/containerd-shim-kvm-v1", "-s -w -X main.version=" + v},
			{"kvm-qemu-wrapper", "./cmd/kvm-qemu-wrapper", "-s -w"},
			{"kvm-shim-installer", "./cmd/kvm-shim-installer", "-s -w"},
		} {
			cmd := exec.Command("go", "build", "-trimpath", "-ldflags", b.ldflags, "-o", filepath.Join(bin, b.out), b.pkg)
			cmd.Dir, cmd.Env = s.repo, append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("go build %s: %v\n%s", b.pkg, err, out)
			}
		}
		cmd := exec.Command(filepath.Join(s.repo, "deploy", "image.sh"))
		cmd.Env = append(os.Environ(), "VERSION="+v, "DEPLOY_BIN="+bin, "DEPLOY_OUT="+filepath.Join(s.tmp, "deploy-"+v))
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("deploy/image.sh: %v\n%s", err, out)
		}
		archives = append(archives, strings.TrimSpace(string(out)))
	}
	return archives
}

// shimOf is the shim binary of version v the test built.
func (s *testSuite) shimOf(t *testing.T, v string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.tmp, "deploy-"+v, "bin", "containerd-shim-kvm-v1"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// startBare starts a containerd without the kvm runtime, a supervisor
// that starts it again when the installer stops it (-restart=pidfile),
// and a cluster on it with a second node, whose containerd starts
// meanwhile.
func (s *testSuite) startBare(t *testing.T, name string, archives []string) *installerEnv {
	t.Helper()
	f, err := testenv.LookupFlavour(name)
	if err != nil {
		t.Fatal(err)
	}
	key := fmt.Sprintf("%s-%d", name, s.bareClusters.Add(1))
	dir := filepath.Join(s.tmp, "installer-"+key)
	ie := &installerEnv{
		prefix:    filepath.Join(s.wrapperDir, "node-"+key), // the QEMU user reaches the wrapper there
		dropinDir: filepath.Join(dir, "conf.d"),
		stateDir:  filepath.Join(dir, "installer-state"),
		pidFile:   filepath.Join(dir, "containerd.pid"),
	}
	if err = os.MkdirAll(filepath.Join(ie.prefix, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	var imports []string
	if name != "1.6" {
		imports = []string{filepath.Join(ie.dropinDir, "*.toml")}
	}
	n := networks[name]
	ctx := context.Background()
	begin := time.Now()
	ie.node2 = startNode2(f, filepath.Join(dir, "node2"))
	t.Cleanup(func() { ie.stop(t) })
	wrapper := filepath.Join(ie.prefix, "libexec", "containerd-shim-kvm-v1", "kvm-qemu-wrapper")
	ctd, err := testenv.Start(ctx, f, testenv.Options{
		Dir:          filepath.Join(dir, "containerd"),
		PathPrefix:   filepath.Join(ie.prefix, "bin"),
		ShimConfig:   testenv.SuiteShimConfig(wrapper, filepath.Join(dir, "numa.json"), filepath.Join(s.tmp, "ids.json")),
		SandboxImage: pauseImage, Bridge: n.bridge, Subnet: n.subnet, DefaultGateway: true,
		LogLevel: "info", StartTimeout: 90 * time.Second,
		NoKVMRuntime: true, Imports: imports,
	})
	ie.env = &env{name: name, ctd: ctd}
	if err != nil {
		t.Fatal(err)
	}
	if ie.original, err = os.ReadFile(ctd.ConfigPath); err != nil {
		t.Fatal(err)
	}
	ie.supervise(t)
	for _, a := range append(imageArchives(s), archives...) {
		if _, importErr := ctd.Import(ctx, a, testenv.NamespaceCRI); importErr != nil {
			t.Fatal(importErr)
		}
	}
	node2, err := ie.node2.wait()
	if err != nil {
		t.Fatal(err)
	}
	waited := time.Since(begin)
	ie.cluster, err = kube.Start(ctx, kube.Options{
		Dir: filepath.Join(dir, "kube"), BinDir: s.k8sBin, Node: nodeName, NodeLink: nodeLink, NodeIP: nodeIP,
		ServiceCIDR: serviceCIDR, PodCIDR: n.subnet, CRISocket: ctd.Address, Scheduler: true, Nodes: []kube.Node{node2},
	})
	if err != nil {
		t.Fatal(err)
	}
	ms := func(d time.Duration) time.Duration { return d.Round(100 * time.Millisecond) }
	t.Logf("second node's containerd started and imported in %s (in the background); cluster start from %s, two nodes ready at %s",
		ms(ie.node2.started), ms(waited), ms(time.Since(begin)))
	ie.node2.readyAfterFirst(t, ie.env)
	return ie
}

func imageArchives(s *testSuite) []string {
	var a []string
	for _, f := range imageFiles {
		a = append(a, filepath.Join(s.imagesDir, f))
	}
	return a
}

// supervise keeps containerd's pid in the pid file and starts containerd
// again when it exits, as an init system does.
func (ie *installerEnv) supervise(t *testing.T) {
	t.Helper()
	write := func() {
		if err := os.WriteFile(ie.pidFile, []byte(strconv.Itoa(ie.ctd.Pid())+"\n"), 0o644); err != nil {
			t.Error(err)
		}
	}
	write()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if !ie.ctd.Exited() {
				continue
			}
			ie.restarts.Add(1)
			if err := ie.ctd.Relaunch(context.Background()); err != nil {
				t.Errorf("supervisor: %v", err)
				return
			}
			write()
		}
	}()
	ie.stopSupervisor = func() { close(done); wg.Wait() }
}

func (ie *installerEnv) stop(t *testing.T) {
	if ie.stopSupervisor != nil {
		ie.stopSupervisor()
	}
	<-ie.node2.ready
	up := ie.cluster != nil && ie.cluster.Pid("kube-apiserver") != 0
	if up {
		_, _ = ie.cluster.Kubectl(context.Background(), nil, "-n", "kube-system", "delete", "daemonset", "kvm-shim-installer",
			"--ignore-not-found", "--wait=true", "--timeout=1m")
		_, _ = ie.cluster.Kubectl(context.Background(), nil, "-n", "kube-system", "delete", "pods", "-l",
			"app.kubernetes.io/name=kvm-shim-installer", "--wait=true", "--timeout=1m")
		if t.Failed() {
			t.Logf("installer pods:\n%s", ie.installerLogs())
			t.Logf("kubelet of %s log (tail):\n%s", node2Name, ie.cluster.LogTail("kubelet-"+node2Name, 40))
		}
	}
	// Both nodes drain at once (each waits for its kubelet's garbage
	// collection); the second node costs only what its drain takes longer.
	var wg sync.WaitGroup
	var first, second time.Duration
	if up && ie.node2.ctd != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			begin := time.Now()
			ie.drainNode2(t)
			second = time.Since(begin)
		}()
	}
	if ie.env != nil {
		begin := time.Now()
		ie.env.drain(t)
		first = time.Since(begin)
	}
	wg.Wait()
	ie.node2.cost = append(ie.node2.cost, stepCost{"drain beyond the first node's", max(0, second-first)})
	if ie.env != nil {
		ie.env.halt(t)
	}
	done := ie.node2.timed("stop")
	ie.node2.stop(t)
	done()
	ie.node2.logCost(t)
}

// manifest is deploy/installer.yaml for this node: image version v, mode,
// the node's paths and -restart=pidfile. The e2e apiserver listens on
// 127.0.0.1 only, so the pod uses the host's network and that address.
func (ie *installerEnv) manifest(t *testing.T, v, mode string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(suite.repo, "deploy", "installer.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	args, _ := json.Marshal([]string{mode, "-restart=pidfile", "-pid-file=" + ie.pidFile, "-containerd-socket=" + ie.ctd.Address,
		"-prefix=" + ie.prefix, "-shim-config=" + ie.ctd.ShimConfigPath, "-containerd-config=" + ie.ctd.ConfigPath,
		"-dropin-dir=" + ie.dropinDir, "-state-dir=" + ie.stateDir, "-recheck=30s"})
	m := string(b)
	for _, r := range [][2]string{
		{"image: " + installerImage + ":latest", "image: " + installerImage + ":" + v},
		{`args: ["install", "-restart=systemd"]`, "args: " + string(args)},
		{"      hostPID: true\n", "      hostPID: true\n      hostNetwork: true\n"},
		{"              fieldPath: spec.nodeName\n", "              fieldPath: spec.nodeName\n" +
			"        - {name: KUBERNETES_SERVICE_HOST, value: \"127.0.0.1\"}\n" +
			fmt.Sprintf("        - {name: KUBERNETES_SERVICE_PORT, value: \"%d\"}\n", kube.DefaultPorts.APIServer)},
	} {
		if strings.Count(m, r[0]) != 1 {
			t.Fatalf("deploy/installer.yaml: %q is not there once", r[0])
		}
		m = strings.Replace(m, r[0], r[1], 1)
	}
	return []byte(m)
}

func (ie *installerEnv) applyInstaller(t *testing.T, v, mode string) {
	t.Helper()
	if _, err := ie.cluster.Kubectl(context.Background(), ie.manifest(t, v, mode), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
}

type installerPod struct{ name, node, phase, image string }

func (ie *installerEnv) installerPods() []installerPod {
	out, err := ie.cluster.Kubectl(context.Background(), nil, "-n", "kube-system", "get", "pods", "-l",
		"app.kubernetes.io/name=kvm-shim-installer", "-o", "json")
	if err != nil {
		return nil
	}
	var list struct {
		Items []struct {
			Metadata struct {
				Name              string  `json:"name"`
				DeletionTimestamp *string `json:"deletionTimestamp"`
			} `json:"metadata"`
			Spec struct {
				NodeName   string `json:"nodeName"`
				Containers []struct {
					Image string `json:"image"`
				} `json:"containers"`
			} `json:"spec"`
			Status struct {
				Phase string `json:"phase"`
			} `json:"status"`
		} `json:"items"`
	}
	if json.Unmarshal([]byte(out), &list) != nil {
		return nil
	}
	var pods []installerPod
	for _, i := range list.Items {
		if i.Metadata.DeletionTimestamp != nil {
			continue
		}
		pods = append(pods, installerPod{i.Metadata.Name, i.Spec.NodeName, i.Status.Phase, i.Spec.Containers[0].Image})
	}
	return pods
}

func (ie *installerEnv) installerLogs() string {
	var b strings.Builder
	for _, p := range ie.installerPods() {
		out, err := ie.cluster.Kubectl(context.Background(), nil, "-n", "kube-system", "logs", p.name)
		fmt.Fprintf(&b, "--- %s (%s, %s): %v\n%s\n", p.name, p.image, p.phase, err, testenv.Tail(out, 30))
	}
	return b.String()
}

// waitInstallerRun waits until the running installer pod of image v has
// logged a finished run (msg="done", or failed with what) and returns its log.
func (ie *installerEnv) waitInstallerRun(t *testing.T, v, what string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var log string
	if err := testenv.Poll(ctx, time.Second, func() (bool, string) {
		for _, p := range ie.installerPods() {
			if p.image != installerImage+":"+v || p.phase != "Running" {
				continue
			}
			out, err := ie.cluster.Kubectl(ctx, nil, "-n", "kube-system", "logs", p.name)
			log = out
			return err == nil && strings.Contains(out, what), testenv.Tail(out, 5)
		}
		return false, fmt.Sprintf("no running installer pod of %s: %+v", v, ie.installerPods())
	}); err != nil {
		t.Fatalf("installer %s: %q not logged: %v\n%s", v, what, err, ie.installerLogs())
	}
	return log
}

func (ie *installerEnv) waitLabel(t *testing.T, want string, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := testenv.Poll(ctx, time.Second, func() (bool, string) {
		got := ie.label(t)
		return got == want, fmt.Sprintf("label %q", got)
	}); err != nil {
		t.Fatalf("node label kvm.containerd.io/runtime: %v, want %q\n%s", err, want, ie.installerLogs())
	}
}

func (ie *installerEnv) label(t *testing.T) string {
	t.Helper()
	return ie.kubectl(t, "get", "node", nodeName, "-o", `jsonpath={.metadata.labels.kvm\.containerd\.io/runtime}`)
}

// assertShim checks that the node's shim is version v's binary.
func (ie *installerEnv) assertShim(t *testing.T, v string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(ie.prefix, "bin", "containerd-shim-kvm-v1"))
	if err != nil || !bytes.Equal(b, suite.shimOf(t, v)) {
		t.Fatalf("the node's shim is not %s's (%v)", v, err)
	}
}

// vmIdentity is what must not change across an upgrade: the QEMU process
// and the guest's boot.
type vmIdentity struct{ qemuPid, bootID string }

func (ie *installerEnv) identity(t *testing.T, pod string) vmIdentity {
	t.Helper()
	p, err := ie.getPod(pod)
	if err != nil {
		t.Fatal(err)
	}
	dom := ie.vmDomain(t, p.Metadata.UID)
	pid, err := os.ReadFile(filepath.Join("/run/libvirt/qemu", dom+".pid"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	var boot string
	if err := testenv.Poll(ctx, 500*time.Millisecond, func() (bool, string) {
		out, err := ie.cluster.Kubectl(ctx, nil, "exec", pod, "--", "cat", "/proc/sys/kernel/random/boot_id")
		boot = strings.TrimSpace(out)
		return err == nil && len(boot) == 36, fmt.Sprintf("%q %v", out, err)
	}); err != nil {
		t.Fatalf("boot id of %s: %v", pod, err)
	}
	return vmIdentity{strings.TrimSpace(string(pid)), boot}
}

// shimExes lists the executables of the kvm shims running from the
// node's prefix, as /proc shows them: a shim started before an upgrade
// shows its replaced file as "... (deleted)".
func (ie *installerEnv) shimExes() []string {
	var exes []string
	procs, _ := filepath.Glob("/proc/[0-9]*/exe")
	for _, p := range procs {
		exe, err := os.Readlink(p)
		if err == nil && strings.HasPrefix(exe, filepath.Join(ie.prefix, "bin", "containerd-shim-kvm-v1")) {
			exes = append(exes, exe)
		}
	}
	return exes
}

func testInstallUpgradeRemove(t *testing.T, ie *installerEnv) {
	n, n1 := installerVersions[0], installerVersions[1]
	watch := ie.watchNode2(t)
	// A VM pod created before any node has the shim stays Pending: the
	// RuntimeClass's nodeSelector matches neither node.
	rc := filepath.Join(suite.repo, "deploy", "runtimeclass.yaml")
	if _, err := ie.cluster.Kubectl(context.Background(), nil, "apply", "-f", rc); err != nil {
		t.Fatal(err)
	}
	vm := podOpts{name: "vm-up", image: kernelImage, vm: true, probe: echoPort}
	ie.apply(t, pod(vm))
	ie.waitUnschedulable(t, vm.name, "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector")

	// Install on a node whose libvirt is missing: the runtime is
	// configured (one restart), check fails, no label, an event names
	// the check. Fixed, the installer's next run (-recheck) labels it.
	shimConfig, err := os.ReadFile(ie.ctd.ShimConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	broken := append(append([]byte{}, shimConfig...), fmt.Sprintf("libvirt_socket = %q\n", filepath.Join(ie.stateDir, "no-libvirt.sock"))...)
	if err := os.WriteFile(ie.ctd.ShimConfigPath, broken, 0o644); err != nil {
		t.Fatal(err)
	}
	ie.applyInstaller(t, n, "install")
	ie.waitInstallerRun(t, n, "check failed: libvirt")
	ie.assertDaemonSetSkipsNode2(t)
	if got := ie.label(t); got != "" {
		t.Fatalf("node labelled %q with check failing", got)
	}
	events := ie.kubectl(t, "get", "events", "-n", "default", "--field-selector", "involvedObject.kind=Node,reason=KvmShimCheckFailed",
		"-o", "jsonpath={.items[*].message}")
	if !strings.Contains(events, "containerd-shim-kvm-v1 check failed: libvirt") {
		t.Fatalf("events on the node: %q, want one naming the libvirt check", events)
	}
	t.Logf("check failing: no label, event %q", events)
	if err := os.WriteFile(ie.ctd.ShimConfigPath, shimConfig, 0o644); err != nil {
		t.Fatal(err)
	}
	ie.waitLabel(t, "ready", 2*time.Minute)
	if got := ie.label(t); got != "ready" {
		t.Fatalf("node label kvm.containerd.io/runtime=%q after the install, want ready\n%s", got, ie.installerLogs())
	}
	if r := ie.restarts.Load(); r != 1 {
		t.Fatalf("containerd restarted %d times by the install, want 1", r)
	}
	ie.assertShim(t, n)

	// Labelled, the node takes the pending VM pod; two runc pods that
	// may not share a node start meanwhile, one on each.
	runcPods, spread := spreadRuncPods()
	ie.apply(t, spread...)
	if p := ie.waitReady(t, vm.name); p.Spec.NodeName != nodeName {
		t.Fatalf("VM pod scheduled to %q, want %s", p.Spec.NodeName, nodeName)
	}
	doneRunc := ie.node2.timed("runc pods, after the VM pod's boot")
	runcOn2 := ie.checkRuncOnBothNodes(t, runcPods)
	doneRunc()
	before := ie.identity(t, vm.name)
	t.Logf("VM pod on %s: QEMU pid %s, boot id %s", n, before.qemuPid, before.bootID)

	// The installer's pod restarted and the DaemonSet re-applied: nothing changes.
	config := ie.readConfig(t)
	ie.kubectl(t, "-n", "kube-system", "delete", "pods", "-l", "app.kubernetes.io/name=kvm-shim-installer", "--wait=true")
	ie.applyInstaller(t, n, "install")
	ie.waitInstallerRun(t, n, `msg=done`)
	if r := ie.restarts.Load(); r != 1 || !bytes.Equal(ie.readConfig(t), config) {
		t.Fatalf("a rerun at the same version: containerd restarts %d (want still 1), config changed %v", r,
			!bytes.Equal(ie.readConfig(t), config))
	}

	// Upgrade N -> N+1 with the VM pod running.
	ie.kubectl(t, "-n", "kube-system", "set", "image", "daemonset/kvm-shim-installer", "installer="+installerImage+":"+n1)
	ie.waitInstallerRun(t, n1, `msg=done`)
	ie.assertShim(t, n1)
	ie.assertSameVM(t, vm.name, before, n1)
	exes := ie.shimExes()
	t.Logf("after the upgrade to %s: shims %q, containerd restarts %d", n1, exes, ie.restarts.Load())
	if len(exes) != 1 || !strings.HasSuffix(exes[0], " (deleted)") {
		t.Errorf("shims after the upgrade: %q, want the VM pod's, still running its replaced (deleted) binary", exes)
	}
	// A pod created now runs N+1's shim. Created while the node with the
	// shim is cordoned, it waits for it: the node without the shim has
	// room but does not match.
	vm2 := podOpts{name: "vm-new", image: kernelImage, vm: true, probe: echoPort}
	doneCordon := ie.node2.timed("cordoned node")
	ie.kubectl(t, "cordon", nodeName)
	ie.apply(t, pod(vm2))
	ie.waitUnschedulable(t, vm2.name, "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector",
		"1 node(s) were unschedulable")
	ie.kubectl(t, "uncordon", nodeName)
	doneCordon()
	if p := ie.waitReady(t, vm2.name); p.Spec.NodeName != nodeName {
		t.Fatalf("VM pod scheduled to %q once the node was uncordoned, want %s", p.Spec.NodeName, nodeName)
	}
	fresh := 0
	for _, e := range ie.shimExes() {
		if !strings.HasSuffix(e, " (deleted)") {
			fresh++
		}
	}
	t.Logf("with a pod created on %s: shims %q", n1, ie.shimExes())
	if fresh != 1 {
		t.Errorf("shims with the pod created after the upgrade: %q, want one running the installed (N+1) binary", ie.shimExes())
	}
	ie.deletePod(t, vm2.name)

	// Downgrade N+1 -> N.
	ie.kubectl(t, "-n", "kube-system", "set", "image", "daemonset/kvm-shim-installer", "installer="+installerImage+":"+n)
	ie.waitInstallerRun(t, n, `msg=done`)
	ie.assertShim(t, n)
	ie.assertSameVM(t, vm.name, before, n)

	ie.testUninstall(t, vm.name)
	assertNoVMOnNode2(t, watch, runcOn2)
}

// waitUnschedulable waits until the pod is unbound and Unschedulable with
// a scheduler's message holding each of reasons (the scheduler tries
// again as nodes change, so an early message may give other reasons).
func (ie *installerEnv) waitUnschedulable(t *testing.T, name string, reasons ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var msg string
	if err := testenv.Poll(ctx, 250*time.Millisecond, func() (bool, string) {
		const cond = `{.status.conditions[?(@.type=="PodScheduled")]`
		out, err := ie.cluster.Kubectl(ctx, nil, "get", "pod", name, "-o", "jsonpath={.spec.nodeName}|"+cond+".reason}|"+cond+".message}")
		msg = out
		if err != nil || !strings.HasPrefix(out, "|Unschedulable|") {
			return false, fmt.Sprintf("%q %v", out, err)
		}
		for _, r := range reasons {
			if !strings.Contains(out, r) {
				return false, fmt.Sprintf("%q lacks %q", out, r)
			}
		}
		return true, ""
	}); err != nil {
		t.Fatalf("pod %s: %v, want Unschedulable for %q", name, err, reasons)
	}
	t.Logf("VM pod %s pending: %s", name, msg)
}

// assertDaemonSetSkipsNode2 checks that the installer's DaemonSet wants a
// pod on the first node only: the second is labelled to opt out.
func (ie *installerEnv) assertDaemonSetSkipsNode2(t *testing.T) {
	t.Helper()
	got := ie.kubectl(t, "-n", "kube-system", "get", "daemonset", "kvm-shim-installer", "-o",
		"jsonpath={.status.desiredNumberScheduled}")
	if got != "1" {
		t.Fatalf("the installer's DaemonSet wants %s pod(s), want 1: %s is labelled %s=%s", got, node2Name,
			installOptOutKey, installOptOutValue)
	}
}

func (ie *installerEnv) readConfig(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(ie.ctd.ConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// assertSameVM: the VM pod kept its QEMU and its guest's boot, its shim
// serves logs and exec, and containerd was not restarted again.
func (ie *installerEnv) assertSameVM(t *testing.T, pod string, before vmIdentity, v string) {
	t.Helper()
	if after := ie.identity(t, pod); after != before {
		t.Errorf("after the move to %s: QEMU pid %s, boot id %s; was %s, %s", v, after.qemuPid, after.bootID, before.qemuPid, before.bootID)
	}
	if logs := ie.kubectl(t, "logs", pod); !strings.Contains(logs, readyLine) {
		t.Errorf("kubectl logs %s after the move to %s lacks %s", pod, v, readyLine)
	}
	if r := ie.restarts.Load(); r != 1 {
		t.Errorf("containerd restarted %d times by the move to %s; the runtime configuration did not change, want 1 (the install's)", r, v)
	}
}

// testUninstall: the label goes first, the installer waits for the VM
// pod, then containerd's config is back byte for byte after one restart
// and the binaries are gone.
func (ie *installerEnv) testUninstall(t *testing.T, vmPod string) {
	t.Helper()
	ie.kubectl(t, "-n", "kube-system", "patch", "daemonset", "kvm-shim-installer", "--type=json",
		"-p", `[{"op":"replace","path":"/spec/template/spec/containers/0/args/0","value":"uninstall"}]`)
	ie.waitInstallerRun(t, installerVersions[0], "default/"+vmPod)
	if got := ie.label(t); got != "" {
		t.Fatalf("label %q while uninstall waits for the VM pod, want none", got)
	}
	if r := ie.restarts.Load(); r != 1 {
		t.Fatalf("uninstall restarted containerd (%d) while a VM pod runs", r)
	}
	ie.assertShim(t, installerVersions[0])
	ie.deletePod(t, vmPod)
	ie.waitInstallerRun(t, installerVersions[0], `msg=done`)
	if r := ie.restarts.Load(); r != 2 {
		t.Errorf("containerd restarts %d after uninstall, want 2 (install, uninstall)", r)
	}
	t.Logf("uninstalled: containerd restarts %d, config %d bytes (was %d)", ie.restarts.Load(), len(ie.readConfig(t)), len(ie.original))
	if got := ie.readConfig(t); !bytes.Equal(got, ie.original) {
		t.Errorf("containerd's config after uninstall:\n%s\nwant, as before the install:\n%s", got, ie.original)
	}
	for _, p := range []string{filepath.Join(ie.prefix, "bin", "containerd-shim-kvm-v1"),
		filepath.Join(ie.dropinDir, "containerd-shim-kvm-v1.toml"), filepath.Join(ie.stateDir, "record.json")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left after uninstall (%v)", p, err)
		}
	}
}
