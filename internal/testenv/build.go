package testenv

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// ShimBinary is the shim's binary name; containerd finds it on its PATH.
const ShimBinary = "containerd-shim-kvm-v1"

// BuildShim builds the shim from the repository at repo into binDir, and
// kvm-qemu-wrapper, statically, into wrapperDir/bin: libvirt runs the
// wrapper as the QEMU user, so wrapperDir (under /run, say) and bin are
// made mode 0755. It returns the wrapper's path; the error carries the
// build's output.
func BuildShim(repo, binDir, wrapperDir string) (wrapper string, err error) {
	bin := filepath.Join(wrapperDir, "bin")
	for _, d := range []string{binDir, wrapperDir, bin} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", err
		}
		if err := os.Chmod(d, 0o755); err != nil {
			return "", err
		}
	}
	wrapper = filepath.Join(bin, "kvm-qemu-wrapper")
	builds := []struct {
		out, pkg string
	}{
		{filepath.Join(binDir, ShimBinary), "./cmd/containerd-shim-kvm-v1"},
		{wrapper, "./cmd/kvm-qemu-wrapper"},
	}
	for _, b := range builds {
		if err := goBuild(repo, b.out, b.pkg); err != nil {
			return "", err
		}
	}
	return wrapper, nil
}

// BuildFaultShim builds the shim with the faultinject tag into out: the
// variant that a fault test can hold at a named step (internal/faultpoint).
// Only fault tests install it; everything else runs the shim that ships.
func BuildFaultShim(repo, out string) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	return goBuild(repo, out, "./cmd/containerd-shim-kvm-v1", "-tags", "faultinject")
}

// goBuild builds pkg of the repository at repo statically into out; the
// error carries the build's output.
func goBuild(repo, out, pkg string, flags ...string) error {
	args := append(append([]string{"build"}, flags...), "-o", out, pkg)
	cmd := exec.Command("go", args...)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, b)
	}
	return nil
}

// Host locks: runs that take the same fixed names (CNI bridges, subnets,
// links, ports) on this host wait for each other. The integration suite
// and the e2e tier use disjoint names and each has its own lock.
const (
	IntegrationLock = "/run/kvm-shim-integration.lock"
	E2ELock         = "/run/kvm-shim-e2e.lock"
)

// LockHost takes the lock file path, waiting while another run holds it.
func LockHost(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		fmt.Fprintf(os.Stderr, "waiting for another run to release %s\n", path)
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
	}
	return func() { f.Close() }, nil
}

// SuiteShimConfig is the kvm shim's own config for the test suites (passed
// as Options.ShimConfig, beyond the libvirt_uri and state_dir testenv
// writes): TCG, the freshly built emulator wrapper and a NUMA store of the
// suite's own.
//
// The host is shared: a shim that starts adopts the NUMA placement of every
// live VM on the node into its store, other people's too (a benchmark's ten
// VMs fill a 2-CPU node at the default cpu_threshold of 4). Generous
// thresholds keep the suite's VMs placeable whatever else runs; placement
// itself (node and dedicated) is still checked by the integration suite's
// TestCtrNUMA.
//
// The VMs' host identities come from a store of the suite's own
// (idStateFile, shared by all of its containerds) and a range of its own
// (SuiteIDRange), apart from the node's default range: the suite's VMs
// never share a uid with each other or with VMs outside the suite, and
// whatever the store still holds once the suite's pods are gone leaked.
func SuiteShimConfig(wrapper, numaStateFile, idStateFile string) string {
	return fmt.Sprintf(`accel = "tcg"
qemu_wrapper = %q
numa_state_file = %q
vm_id_state_file = %q
vm_id_range = %q
cpu_threshold = 100.0
mem_threshold = 16.0
default_vcpus = 1
default_memory_mib = 256
`, wrapper, numaStateFile, idStateFile, SuiteIDRange(os.Getpid()))
}

// SuiteIDRange is the 100 host ids of the test run with process id pid:
// above the default range, one block per pid modulo 10000, so suites
// running at once (integration beside e2e) do not meet.
func SuiteIDRange(pid int) string {
	first := 1100000000 + (pid%10000)*100
	return fmt.Sprintf("%d-%d", first, first+99)
}

// HostIDs reads a shim's vm_id_state_file: the id each VM owner
// (domain/container) holds. A missing file holds none.
func HostIDs(path string) (map[string]uint32, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var st struct {
		Allocations []struct {
			Owner string `json:"owner"`
			ID    uint32 `json:"id"`
		} `json:"allocations"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out := map[string]uint32{}
	for _, a := range st.Allocations {
		out[a.Owner] = a.ID
	}
	return out, nil
}
