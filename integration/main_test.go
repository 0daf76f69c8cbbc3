//go:build integration

package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// suite is the environment shared by every test; nil when skipReason is set.
var (
	suite      *testSuite
	skipReason string
)

// testSuite holds what TestMain built and started.
type testSuite struct {
	repo      string
	tmp       string // everything this run creates on disk lives below
	binDir    string // first in containerd's PATH: holds the freshly built shim
	imagesDir string
	// wrapperDir holds the freshly built kvm-qemu-wrapper (the shim config's
	// qemu_wrapper). libvirt runs it as the QEMU user, so it lives under
	// /run in a directory every user can traverse, not in tmp.
	wrapperDir string
	wrapper    string
	// idStateFile is the host identities of the suite's VMs (all flavours).
	idStateFile string

	shimErr error            // why the shim could not be built, if it could not
	images  map[string]image // archives found, by short name

	// cniBinDir is the containerds' CNI plugin dir: Debian's plugins and
	// hack/cni-shape; cniErr says why it could not be made.
	cniBinDir string
	cniErr    error

	flavours []*containerd

	// hostDaemons is held by each cell of a test whose flavours run at
	// once (forEachFlavourAtOnce) that may meet a host daemon's fault:
	// shared by a cell that kills nothing of the host, exclusively by one
	// that kills libvirtd or virtlogd, which every flavour's VMs use.
	hostDaemons sync.RWMutex
}

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if os.Getenv(openAsEnv) == "1" {
		return openAsMain(os.Args[1:])
	}
	if os.Geteuid() != 0 {
		skipReason = "integration tests need root (containerd, mounts, libvirt qemu:///system)"
		return m.Run()
	}
	// The CNI bridges and subnets are fixed names on this host: one run at a time.
	unlock, err := testenv.LockHost(testenv.IntegrationLock)
	if err != nil {
		fmt.Fprintf(os.Stderr, "integration: %v\n", err)
		return 1
	}
	defer unlock()
	// Holding the lock, no live run owns a kvm-it-* directory: what one holds
	// is a dead run's (killed with its session) and would load the host
	// and read as this run's leftovers.
	for _, x := range testenv.SweepDeadRuns(filepath.Join(os.TempDir(), "kvm-it-")) {
		fmt.Fprintf(os.Stderr, "integration: removed what a dead run left: %s\n", x)
	}
	s, err := newSuite()
	if err != nil {
		fmt.Fprintf(os.Stderr, "integration: setup failed: %v\n", err)
		if s != nil {
			if cerr := s.close(); cerr != nil {
				fmt.Fprintf(os.Stderr, "integration: teardown: %v\n", cerr)
			}
		}
		return 1
	}
	suite = s
	code := m.Run()
	if err := s.close(); err != nil {
		fmt.Fprintf(os.Stderr, "integration: FAIL: teardown found leftovers or errors:\n%v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func newSuite() (*testSuite, error) {
	repo, err := filepath.Abs("..")
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "kvm-it-")
	if err != nil {
		return nil, err
	}
	s := &testSuite{
		repo:      repo,
		tmp:       tmp,
		binDir:    filepath.Join(tmp, "bin"),
		imagesDir: envOr("KVM_IT_IMAGES", filepath.Join(repo, "_output", "images")),
	}
	s.idStateFile = filepath.Join(tmp, "ids", "ids.json")
	// libvirt runs QEMU as libvirt-qemu: it must be able to reach the shim's
	// state dir below tmp.
	if err = os.Chmod(tmp, 0o755); err != nil {
		return s, err
	}
	if err = os.MkdirAll(s.binDir, 0o755); err != nil {
		return s, err
	}
	s.wrapperDir = fmt.Sprintf("/run/kvm-shim-it-%d", os.Getpid())
	if s.wrapper, err = testenv.BuildShim(repo, s.binDir, s.wrapperDir); err != nil {
		fmt.Fprintf(os.Stderr, "integration: building the shim failed; tests that need it will fail:\n%v\n", err)
		s.shimErr = errors.New("building the shim or the emulator wrapper failed (its output is at the start of the run)")
	}
	if out, buildCNIBinErr := s.buildCNIBin(); buildCNIBinErr != nil {
		fmt.Fprintf(os.Stderr, "integration: building the test CNI plugin failed; network shape tests will fail:\n%s\n", out)
		s.cniErr = fmt.Errorf("CNI bin dir with hack/cni-shape: %v", buildCNIBinErr)
	}
	var missing []string
	if s.images, missing, err = findImages(s.imagesDir); err != nil {
		return s, err
	}
	if len(missing) > 0 {
		fmt.Fprintf(os.Stderr, "integration: missing guest images in %s: %s; build them with hack/guest/build.sh\n",
			s.imagesDir, strings.Join(missing, ", "))
	}

	wanted := strings.Split(envOr("KVM_IT_FLAVOURS", "1.6,2.x"), ",")
	for _, name := range wanted {
		f, err := testenv.LookupFlavour(strings.TrimSpace(name))
		if err != nil {
			return s, fmt.Errorf("KVM_IT_FLAVOURS: %v", err)
		}
		n := networks[f.Name]
		c, err := startContainerd(s, f, testenv.Options{Bridge: n.bridge, Subnet: n.subnet, CNIBinDir: s.cniBinDir})
		if c != nil {
			s.flavours = append(s.flavours, c)
		}
		if err != nil {
			return s, err
		}
		if err := s.importImages(c); err != nil {
			return s, err
		}
	}
	return s, nil
}

// buildCNIBin makes the CNI plugin dir of the suite's containerds: every
// plugin of Debian's containernetworking-plugins (linked) and the test
// plugin hack/cni-shape, built from the current tree.
func (s *testSuite) buildCNIBin() (output []byte, err error) {
	s.cniBinDir = filepath.Join(s.tmp, "cni-bin")
	if mkdirAllErr := os.MkdirAll(s.cniBinDir, 0o755); mkdirAllErr != nil {
		return nil, mkdirAllErr
	}
	plugins, err := os.ReadDir(testenv.DefaultCNIBinDir)
	if err != nil {
		return nil, err
	}
	for _, p := range plugins {
		if err := os.Symlink(filepath.Join(testenv.DefaultCNIBinDir, p.Name()), filepath.Join(s.cniBinDir, p.Name())); err != nil {
			return nil, err
		}
	}
	cmd := exec.Command("go", "build", "-o", filepath.Join(s.cniBinDir, "kvm-cni-shape"), "./hack/cni-shape")
	cmd.Dir = s.repo
	return cmd.CombinedOutput()
}

func (s *testSuite) importImages(c *containerd) error {
	for _, name := range imageNames {
		img, ok := s.images[name]
		if !ok {
			continue
		}
		if _, err := c.Import(context.Background(), img.archive, nsDefault, nsCRI); err != nil {
			return err
		}
	}
	return nil
}

// close stops everything the suite started and reports what was left behind.
func (s *testSuite) close() error {
	var errs []error
	for _, c := range s.flavours {
		errs = append(errs, c.Stop())
	}
	if err := os.RemoveAll(s.tmp); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", s.tmp, err))
	}
	if s.wrapperDir != "" {
		if err := os.RemoveAll(s.wrapperDir); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", s.wrapperDir, err))
		}
	}
	return errors.Join(errs...)
}

// requireSuite skips without root and returns the suite.
func requireSuite(t *testing.T) *testSuite {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	return suite
}

// requireKVM returns the suite after checking that the shim was built and
// that the named guest images exist; it fails the test otherwise.
func requireKVM(t *testing.T, images ...string) *testSuite {
	t.Helper()
	s := requireSuite(t)
	if s.shimErr != nil {
		t.Fatalf("kvm shim not available: %v", s.shimErr)
	}
	s.requireImages(t, images...)
	return s
}

// requireImages fails the test when a named guest image archive is missing.
func (s *testSuite) requireImages(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, ok := s.images[n]; !ok {
			t.Fatalf("guest image %s (%s) missing in %s: build it with hack/guest/build.sh",
				n, knownImages[n].file, s.imagesDir)
		}
	}
}

// forEachFlavour runs f as a subtest against every running containerd.
func (s *testSuite) forEachFlavour(t *testing.T, f func(t *testing.T, c *containerd)) {
	t.Helper()
	for _, c := range s.flavours {
		t.Run(c.Flavour.Name, func(t *testing.T) {
			c.watch(t)
			f(t, c)
		})
	}
}

// forEachFlavourAtOnce is forEachFlavour with the flavours' subtests run
// at the same time (t.Parallel): most of a case's time is spent waiting
// on a guest under TCG, and each flavour has its own containerd, shim
// state_dir, CNI network, NUMA state file and CRI pod namespace
// (podNamespace), so each leftover check judges its own flavour only. What
// the flavours do share is the host: libvirtd and virtlogd (a cell that
// kills one takes hostDaemons with holdHost), the suite's shim binary
// (useFaultShim counts its users) and the cores. The subtests start when
// the calling test function returns: call it last.
func (s *testSuite) forEachFlavourAtOnce(t *testing.T, f func(t *testing.T, c *containerd)) {
	t.Helper()
	for _, c := range s.flavours {
		t.Run(c.Flavour.Name, func(t *testing.T) {
			t.Parallel()
			c.watch(t)
			f(t, c)
		})
	}
}

// holdHost takes hostDaemons for the rest of t: exclusively when the cell
// kills component and that is a daemon of the host's (libvirtd,
// virtlogd), shared otherwise. The lock is released after t's other
// cleanups (registered later, run earlier), which bring a daemon back.
func (s *testSuite) holdHost(t *testing.T, component string) {
	t.Helper()
	if component == "libvirtd" || component == "virtlogd" {
		s.hostDaemons.Lock()
		t.Cleanup(s.hostDaemons.Unlock)
		return
	}
	s.hostDaemons.RLock()
	t.Cleanup(s.hostDaemons.RUnlock)
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
