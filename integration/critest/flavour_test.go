//go:build integration

package critest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// hostsTOML sends every registry host containerd is asked for to the
// loopback registry: the _default directory applies to each host that has
// no directory of its own, and its server replaces the host's own, so no
// name in an image reference is ever looked up or contacted.
func hostsTOML(certsDir, addr string) error {
	dir := filepath.Join(certsDir, "_default")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	url := "http://" + addr
	body := "# written by integration/critest: every registry is the loopback one\n" +
		fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", url, url)
	return os.WriteFile(filepath.Join(dir, "hosts.toml"), []byte(body), 0o644)
}

// runFlavour starts containerd flavour name with the registry at addr,
// runs critest with each handler in turn, and stops it; what the runs left
// behind fails the test.
func (h *harness) runFlavour(t *testing.T, name, addr string) []run {
	f, err := testenv.LookupFlavour(name)
	if err != nil {
		t.Fatal(err)
	}
	net := networks[name]
	dir := filepath.Join(h.tmp, name)
	certs := filepath.Join(dir, "certs.d")
	if err = hostsTOML(certs, addr); err != nil {
		t.Fatal(err)
	}
	numa := filepath.Join(dir, "numa", "numa.json")
	ctx := context.Background()
	c, err := testenv.Start(ctx, f, testenv.Options{
		Dir: dir, PathPrefix: h.binDir,
		ShimConfig:   testenv.SuiteShimConfig(h.wrapper, numa, h.idStateFile),
		SandboxImage: sandboxImage, Bridge: net[0], Subnet: net[1], DefaultGateway: true,
		RegistryConfigPath: certs, PortMap: true, StartTimeout: 90 * time.Second,
	})
	if c != nil {
		defer func() {
			if serr := c.Stop(); serr != nil {
				t.Errorf("containerd %s: stop: %v", name, serr)
			}
		}()
	}
	if err != nil {
		t.Fatal(err)
	}
	var runs []run
	for _, handler := range handlers {
		r, err := h.runCritest(c, handler)
		if err != nil {
			t.Fatalf("containerd %s, handler %s: %v", name, handler, err)
		}
		p, fl, s := r.specs.Counts()
		t.Logf("containerd %s, handler %s: %d passed, %d failed, %d skipped in %v", name, handler, p, fl, s, r.wall.Round(time.Second))
		r.leftPods = checkLeftovers(t, c, handler)
		runs = append(runs, r)
	}
	return runs
}

// runCritest runs the suite against c with handler, serially, its output
// in a log file beside the JUnit report, and reads the report.
func (h *harness) runCritest(c *testenv.Containerd, handler string) (run, error) {
	base := filepath.Join(h.out, c.Flavour.Name+"-"+handler)
	junit := base + ".xml"
	_ = os.Remove(junit)
	endpoint := "unix://" + c.Address
	args := []string{
		"-runtime-endpoint", endpoint, "-image-endpoint", endpoint,
		"-runtime-handler", handler,
		"-ginkgo.junit-report", junit, "-ginkgo.no-color", "-ginkgo.timeout", "100m",
	}
	if h.focus != "" {
		args = append(args, "-ginkgo.focus", h.focus)
	}
	logf, err := os.Create(base + ".log")
	if err != nil {
		return run{}, err
	}
	defer logf.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 110*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, h.critest, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = h.tmp
	start := time.Now()
	runErr := cmd.Run() // non-zero whenever a spec fails: the report says which
	r := run{flavour: c.Flavour.Name, handler: handler, wall: time.Since(start)}
	b, err := os.ReadFile(junit)
	if err != nil {
		return r, fmt.Errorf("critest (%v) wrote no report; see %s.log: %w", runErr, base, err)
	}
	r.specs, err = ParseJUnit(strings.NewReader(string(b)))
	return r, err
}

// checkLeftovers fails the test on what a run left in containerd beyond
// pods. critest's own cleanup skips the pod of some specs that fail
// before they stored its id (the NamespaceOption specs, say), so a pod
// left is its doing: those pods are removed through CRI, as kubelet would,
// and counted. Anything left after that (a shim, a mount, a domain, an
// address) is a leak of the runtime and fails the test.
func checkLeftovers(t *testing.T, c *testenv.Containerd, handler string) int {
	ctx := context.Background()
	if left := c.WaitNothingLeft(ctx, 30*time.Second); len(left) == 0 {
		return 0
	}
	cl, err := c.DialCRI()
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	n, err := cl.RemoveAllPods(rctx)
	if err != nil {
		t.Errorf("containerd %s, handler %s: removing the %d pods critest left: %v", c.Flavour.Name, handler, n, err)
	}
	if left := c.WaitNothingLeft(ctx, time.Minute); len(left) > 0 {
		t.Errorf("containerd %s, handler %s: left after critest's %d pods were removed: %v; removed: %v",
			c.Flavour.Name, handler, n, left, c.ForceCleanup(ctx))
	}
	return n
}
