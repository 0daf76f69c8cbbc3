//go:build integration

package critest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// The runtime handlers: runc is the baseline, kvm is held to it.
var handlers = []string{"runc", "kvm"}

// Each containerd's private CNI network, apart from the integration
// suite's and the e2e tier's.
var networks = map[string][2]string{
	"1.6": {"kvmcri0", "10.89.40.0/24"},
	"2.x": {"kvmcri1", "10.89.41.0/24"},
}

// sandboxImage is the pause image critest-registry serves; "localhost"
// is the name's registry host, which the hosts config sends to it too.
const sandboxImage = "localhost/kvm-shim-critest/pause:1"

// env is what `make critest` hands the test.
type env struct {
	repo      string
	critest   string // the critest binary
	tools     string // critest-registry, procps, webserver, nonewprivs, pause
	out       string // reports, logs and the summary
	flavours  []string
	focus     string // a ginkgo focus regexp, for a quick partial run
	writeExc  string // when set, write the regressions found as a new exceptions file here
	exception string // the exceptions file the gate reads
}

func loadEnv(t *testing.T) env {
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	e := env{
		repo:      repo,
		critest:   os.Getenv("KVM_CRITEST_BIN"),
		tools:     os.Getenv("KVM_CRITEST_TOOLS"),
		out:       envOr("KVM_CRITEST_OUT", filepath.Join(repo, "_output", "critest")),
		flavours:  strings.Fields(envOr("KVM_CRITEST_FLAVOURS", "1.6 2.x")),
		focus:     os.Getenv("KVM_CRITEST_FOCUS"),
		writeExc:  os.Getenv("KVM_CRITEST_WRITE_EXCEPTIONS"),
		exception: filepath.Join(repo, "integration", "critest", "exceptions.txt"),
	}
	if e.critest == "" || e.tools == "" {
		t.Fatal("KVM_CRITEST_BIN and KVM_CRITEST_TOOLS must be set (make critest sets them)")
	}
	return e
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// run is one critest run: a containerd, a handler, its outcome.
type run struct {
	flavour, handler string
	specs            Specs
	wall             time.Duration
	leftPods         int // pods critest left behind (removed by the test)
}

// TestCritest runs the CRI conformance suite on each containerd with the
// runc handler, then the kvm handler, and fails when a spec passes with
// runc and fails with kvm without an entry in exceptions.txt, or when an
// entry there no longer fails.
func TestCritest(t *testing.T) {
	if os.Getenv("KVM_CRITEST") != "1" {
		t.Skip("the CRI conformance suite runs with `make critest` (KVM_CRITEST=1)")
	}
	if os.Geteuid() != 0 {
		t.Skip("critest needs root (containerd, runc, libvirt qemu:///system)")
	}
	e := loadEnv(t)
	// The containerds and libvirtd are shared host resources.
	unlock, err := testenv.LockHost(testenv.IntegrationLock)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	start := time.Now() // the run's wall time, without the wait for the lock
	// Holding the lock, no live run owns a kvm-critest-* directory: one
	// there is a dead run's (killed with its session), or a failed run's
	// kept for its logs until now.
	for _, x := range testenv.SweepDeadRuns(filepath.Join(os.TempDir(), "kvm-critest-")) {
		t.Logf("removed what an earlier run left: %s", x)
	}
	if err := os.MkdirAll(e.out, 0o755); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, e)
	addr := h.startRegistry(t)
	var runs []run
	for _, name := range e.flavours {
		runs = append(runs, h.runFlavour(t, name, addr)...)
	}
	h.verdict(t, runs, time.Since(start))
}

// harness is what every containerd of the run shares.
type harness struct {
	env
	tmp, binDir, wrapper, idStateFile string
}

func newHarness(t *testing.T, e env) *harness {
	tmp, err := os.MkdirTemp("", "kvm-critest-")
	if err != nil {
		t.Fatal(err)
	}
	// QEMU (libvirt-qemu) must reach the shim's state dir below tmp.
	if err = os.Chmod(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !t.Failed() {
			_ = testenv.RemoveTree(tmp)
		}
	})
	wrapperDir := fmt.Sprintf("/run/kvm-shim-critest-%d", os.Getpid())
	t.Cleanup(func() { _ = os.RemoveAll(wrapperDir) })
	h := &harness{env: e, tmp: tmp, binDir: filepath.Join(tmp, "bin"), idStateFile: filepath.Join(tmp, "ids", "ids.json")}
	h.wrapper, err = testenv.BuildShim(e.repo, h.binDir, wrapperDir)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// startRegistry starts critest-registry on a loopback port and returns
// its address once every image is in; the test's cleanup stops it.
func (h *harness) startRegistry(t *testing.T) string {
	addrFile := filepath.Join(h.tmp, "registry.addr")
	logf, err := os.Create(filepath.Join(h.out, "registry.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	tool := func(n string) string { return filepath.Join(h.tools, n) }
	cmd := exec.Command(tool("critest-registry"), "-listen", "127.0.0.1:0", "-addr-file", addrFile,
		"-procps", tool("procps"), "-webserver", tool("webserver"), "-nonewprivs", tool("nonewprivs"), "-pause", tool("pause"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err = cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// exited is closed once the registry is reaped.
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var addr []byte
	err = testenv.Poll(ctx, 100*time.Millisecond, func() (bool, string) {
		select {
		case <-exited:
			return true, ""
		default:
		}
		var rerr error
		addr, rerr = os.ReadFile(addrFile)
		return rerr == nil, fmt.Sprint(rerr)
	})
	if err != nil || len(addr) == 0 {
		b, _ := os.ReadFile(logf.Name())
		t.Fatalf("critest-registry did not come up: %v\n%s", err, b)
	}
	return strings.TrimSpace(string(addr))
}
