//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/kube"
	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// Guest images the tests use, as hack/guest/build.sh names them.
const (
	pauseImage  = "localhost/kvm-guest/pause:latest"
	kernelImage = "localhost/kvm-guest/kernel:latest"
	biosImage   = "localhost/kvm-guest/bios:latest"
)

var imageFiles = []string{"pause.tar", "kernel.tar", "bios.tar"}

// The host's names and addresses the e2e tier takes; the integration suite
// uses 10.89.0.0/24 and 10.89.1.0/24, benchmarks 10.89.20.0/24 and up.
var networks = map[string]struct{ bridge, subnet string }{
	"1.6": {"kvme2e0", "10.89.16.0/24"},
	"2.x": {"kvme2e1", "10.89.17.0/24"},
}

const (
	nodeName    = "kvm-e2e-node"
	nodeLink    = "kvme2enode"
	serviceCIDR = "10.89.18.0/24"
)

var nodeIP = net.IPv4(10, 89, 15, 1)

// suite is what TestMain built; nil when skipReason is set.
var (
	suite      *testSuite
	skipReason string
)

type testSuite struct {
	repo, tmp  string
	binDir     string // the freshly built shim, first in containerd's PATH
	wrapperDir string // /run/kvm-shim-e2e-<pid>: the QEMU user must reach the wrapper
	wrapper    string
	k8sBin     string
	imagesDir  string
	// bareClusters counts startBare's clusters: each gets directories
	// (and so an etcd) of its own, or a later test on the same flavour
	// would find the node objects, labels and capacity an earlier one
	// left (TestCapacity before TestInstaller).
	bareClusters atomic.Int32
}

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	if os.Geteuid() != 0 {
		skipReason = "e2e tests need root (containerd, kubelet, libvirt qemu:///system)"
		return m.Run()
	}
	// Bridges, subnets, the node's link, ports: one e2e run at a time. The
	// integration suite's names are other ones: it may run meanwhile.
	unlock, err := testenv.LockHost(testenv.E2ELock)
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	defer unlock()
	// Holding the lock, no live run owns a kvm-e2e-* directory: what one holds
	// is a dead run's (killed with its session) and would load the host
	// and read as this run's leftovers.
	for _, x := range testenv.SweepDeadRuns(filepath.Join(os.TempDir(), "kvm-e2e-")) {
		fmt.Fprintf(os.Stderr, "e2e: removed what a dead run left: %s\n", x)
	}
	s, err := newSuite()
	if err == nil {
		suite = s
		code := m.Run()
		if closeErr := s.close(); closeErr != nil {
			fmt.Fprintf(os.Stderr, "e2e: teardown: %v\n", closeErr)
			code = 1
		}
		return code
	}
	fmt.Fprintf(os.Stderr, "e2e: setup failed: %v\n", err)
	if s != nil {
		if err := s.close(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: teardown: %v\n", err)
		}
	}
	return 1
}

func newSuite() (*testSuite, error) {
	repo, err := filepath.Abs("../..")
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "kvm-e2e-")
	if err != nil {
		return nil, err
	}
	s := &testSuite{
		repo: repo, tmp: tmp,
		binDir:     filepath.Join(tmp, "bin"),
		wrapperDir: fmt.Sprintf("/run/kvm-shim-e2e-%d", os.Getpid()),
		imagesDir:  envOr("KVM_IT_IMAGES", filepath.Join(repo, "_output", "images")),
	}
	// libvirt runs QEMU as libvirt-qemu: it must reach the shim's state dir.
	if err = os.Chmod(tmp, 0o755); err != nil {
		return s, err
	}
	if s.wrapper, err = testenv.BuildShim(repo, s.binDir, s.wrapperDir); err != nil {
		return s, err
	}
	for _, f := range imageFiles {
		if _, err := os.Stat(filepath.Join(s.imagesDir, f)); err != nil {
			return s, fmt.Errorf("guest image: %w (hack/guest/build.sh builds it)", err)
		}
	}
	if s.k8sBin = os.Getenv("KVM_E2E_K8S_BIN"); s.k8sBin == "" {
		out, err := exec.Command(filepath.Join(repo, "hack", "k8s", "build.sh")).Output()
		if err != nil {
			return s, fmt.Errorf("hack/k8s/build.sh: %w", err)
		}
		s.k8sBin = strings.TrimSpace(string(out))
	}
	return s, nil
}

func (s *testSuite) close() error {
	return errors.Join(os.RemoveAll(s.tmp), os.RemoveAll(s.wrapperDir))
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// env is one flavour's containerd with a cluster on it.
type env struct {
	name    string
	ctd     *testenv.Containerd
	cluster *kube.Cluster
}

// TestKubernetes runs every case on each containerd flavour, in one
// cluster per flavour (its start costs about half a minute): the cases
// that leave the node as a clean run would come first, then the check of
// the logs of that clean run, then the faults.
func TestKubernetes(t *testing.T) {
	if skipReason != "" {
		t.Skip(skipReason)
	}
	for _, name := range strings.Split(envOr("KVM_IT_FLAVOURS", "1.6,2.x"), ",") {
		name = strings.TrimSpace(name)
		t.Run(name, func(t *testing.T) {
			e := suite.start(t, name)
			cases := []struct {
				name string
				run  func(t *testing.T, e *env)
			}{
				{"VMNextToRunc", testVMNextToRunc},
				{"LogsAndAttach", testLogsAndAttach},
				{"ReadinessGatesOnGuestPort", testReadiness},
				{"ServiceInFrontOfDeployment", testService},
				{"Stats", testStats},
				{"DeletePowersOff", testDelete},
				{"VolumesOfEveryKind", testVolumes},
				{"CleanRunLogs", testCleanRunLogs},
				{"ExecAndExecProbe", testExec},
				{"LifecycleUnderRestartPolicies", testLifecycle},
				{"VirshDestroyRestartsOnSameDisk", testVirshDestroy},
				{"ContainerdAndKubeletRestart", testDaemonRestarts},
			}
			for _, c := range cases {
				if !t.Run(c.name, func(t *testing.T) { c.run(t, e) }) && c.name == "VMNextToRunc" {
					return // nothing else can work
				}
			}
		})
	}
}

// start starts a containerd of flavour name and a cluster on it, both
// stopped at the end of t after every pod is deleted and nothing is found
// left behind.
func (s *testSuite) start(t *testing.T, name string) *env {
	t.Helper()
	f, err := testenv.LookupFlavour(name)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(s.tmp, name)
	n := networks[name]
	ctx := context.Background()
	ctd, err := testenv.Start(ctx, f, testenv.Options{
		Dir:            filepath.Join(dir, "containerd"),
		PathPrefix:     s.binDir,
		ShimConfig:     testenv.SuiteShimConfig(s.wrapper, filepath.Join(dir, "numa.json"), filepath.Join(s.tmp, "ids.json")),
		SandboxImage:   pauseImage,
		Bridge:         n.bridge,
		Subnet:         n.subnet,
		DefaultGateway: true,
		LogLevel:       "info",
		StartTimeout:   90 * time.Second,
	})
	e := &env{name: name, ctd: ctd}
	t.Cleanup(func() { e.stop(t) })
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range imageFiles {
		if _, importErr := ctd.Import(ctx, filepath.Join(s.imagesDir, f), testenv.NamespaceCRI); importErr != nil {
			t.Fatal(importErr)
		}
	}
	started := time.Now()
	e.cluster, err = kube.Start(ctx, kube.Options{
		Dir:         filepath.Join(dir, "kube"),
		BinDir:      s.k8sBin,
		Node:        nodeName,
		NodeLink:    nodeLink,
		NodeIP:      nodeIP,
		ServiceCIDR: serviceCIDR,
		PodCIDR:     n.subnet,
		CRISocket:   ctd.Address,
		// Pods name no node: the scheduler places them, as in a cluster.
		Scheduler: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster on containerd %s ready in %s", name, time.Since(started).Round(100*time.Millisecond))
	if err := e.cluster.Apply(ctx, runtimeClass()); err != nil {
		t.Fatal(err)
	}
	return e
}

// stop deletes every workload, checks that nothing is left, and stops
// the cluster and containerd.
func (e *env) stop(t *testing.T) {
	e.drain(t)
	e.halt(t)
}

// drain deletes every workload and checks that nothing is left of them
// on the node.
func (e *env) drain(t *testing.T) {
	ctx := context.Background()
	if e.cluster != nil && e.cluster.Pid("kube-apiserver") != 0 {
		if _, err := e.cluster.Kubectl(ctx, nil, "delete", "deployments,services,pods", "--all", "-n", "default", "--wait=true",
			"--timeout=2m"); err != nil {
			t.Errorf("delete the workloads: %v", err)
		}
		if left := e.ctd.WaitNothingLeft(ctx, sandboxGCTimeout); len(left) > 0 {
			t.Errorf("left behind once every pod was deleted:\n  %s", strings.Join(left, "\n  "))
		}
		if left := testenv.DirNames(filepath.Join(e.cluster.KubeletDir, "pods")); len(left) > 0 {
			t.Errorf("kubelet pod directories left: %v", left)
		}
	}
}

// halt stops the cluster and containerd, with their logs when t failed.
func (e *env) halt(t *testing.T) {
	ctx := context.Background()
	if e.cluster != nil {
		if err := e.cluster.Stop(); err != nil {
			t.Errorf("stop the cluster: %v", err)
		}
		if t.Failed() {
			for _, c := range []string{"kubelet", "kube-apiserver", "kube-controller-manager", "kube-proxy"} {
				t.Logf("%s log (tail):\n%s", c, e.cluster.LogTail(c, 40))
			}
		}
	}
	if e.ctd != nil {
		if t.Failed() {
			t.Logf("containerd %s log (tail):\n%s", e.name, e.ctd.LogTail(0, 60))
		}
		if removed := e.ctd.ForceCleanup(ctx); len(removed) > 0 {
			t.Errorf("had to remove: %v", removed)
		}
		if err := e.ctd.Stop(); err != nil {
			t.Errorf("stop containerd: %v", err)
		}
	}
}
