//go:build integration

package integration

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

const (
	nsDefault   = testenv.NamespaceDefault
	nsCRI       = testenv.NamespaceCRI
	kvmRuntime  = testenv.RuntimeKVM
	runcRuntime = testenv.RuntimeRunc
	shimBinary  = testenv.ShimBinary
	cniNetwork  = "kvmtest"
)

// network is the private CNI network of one containerd: a bridge only on
// this machine, which is the pods' default gateway (as on a real node,
// where pods have a default route; the VM tests check that the guest gets
// it).
type network struct{ bridge, subnet string }

// networks are those of the flavours the suite starts.
var networks = map[string]network{
	"1.6": {"kvmtest0", "10.89.0.0/24"},
	"2.x": {"kvmtest1", "10.89.1.0/24"},
}

// containerd is one private containerd instance started by the suite.
type containerd struct {
	*testenv.Containerd

	// NUMAStateFile is the shim's numa_state_file: this containerd's own,
	// so the suite's reservations neither meet nor disturb the node's.
	NUMAStateFile string
	suite         *testSuite

	seenMu      sync.Mutex
	seenDomains map[string]bool // domains seen to be this containerd's; guarded by seenMu
}

// startContainerd starts a private containerd of flavour f in a directory
// of the suite's named after f.Name, with the freshly built shim first in
// its PATH, the suite's shim config and debug logging. o names the CNI
// bridge and subnet and may set MountSetup; the rest is set here.
func startContainerd(s *testSuite, f testenv.Flavour, o testenv.Options) (*containerd, error) {
	o.Dir = filepath.Join(s.tmp, f.Name)
	numa := filepath.Join(o.Dir, "numa", "numa.json")
	o.PathPrefix = s.binDir
	o.ShimConfig = testenv.SuiteShimConfig(s.wrapper, numa, s.idStateFile)
	o.SandboxImage = sandboxImage
	o.CNINetwork = cniNetwork
	o.DefaultGateway = true
	o.LogLevel = "debug"
	// 30 s for containerd to answer ctr, then 60 s for CRI to be ready.
	o.StartTimeout = 90 * time.Second
	ctd, err := testenv.Start(context.Background(), f, o)
	if ctd == nil {
		return nil, err
	}
	return &containerd{Containerd: ctd, NUMAStateFile: numa, suite: s}, err
}

// inMountNS runs a shell script in containerd's mount namespace (see
// testenv.Options.MountSetup).
func (c *containerd) inMountNS(script string) error {
	out, err := exec.Command("nsenter", fmt.Sprintf("--mount=/proc/%d/ns/mnt", c.Pid()),
		"sh", "-euc", script).CombinedOutput()
	if err != nil {
		return fmt.Errorf("in the mount namespace of containerd %s: %s: %v: %s", c.Flavour.Name, script, err, out)
	}
	return nil
}

// watch prints what containerd logged during t when t fails.
func (c *containerd) watch(t *testing.T) {
	mark := c.LogSize()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("containerd %s log during this test (tail):\n%s", c.Flavour.Name, c.LogTail(mark, 80))
		}
	})
}

// ctr runs this flavour's ctr against this containerd in namespace ns
// ("" for none) and waits at most two minutes.
func (c *containerd) ctr(ns string, args ...string) testenv.Result {
	return c.Ctr(context.Background(), ns, args...)
}

// mustCtr runs ctr and fails the test unless it exits 0.
func (c *containerd) mustCtr(t *testing.T, ns string, args ...string) testenv.Result {
	t.Helper()
	r := c.ctr(ns, args...)
	if r.Err != nil {
		t.Fatalf("%v", r)
	}
	return r
}

// poll calls cond every 100ms until it reports done or timeout passes; the
// error carries cond's last detail.
func poll(timeout time.Duration, cond func() (done bool, detail string)) error {
	deadline := time.Now().Add(timeout)
	for {
		done, detail := cond()
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not done after %v: %s", timeout, detail)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
