package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

const (
	shimBinary    = "containerd-shim-kvm-v1"
	wrapperBinary = "kvm-qemu-wrapper"
	hostLockPath  = "/run/kvm-bench.lock"
)

// network is the private CNI network of one flavour: names no other user
// of this host (the integration suite uses kvmtest0/1, 10.89.0-1.0/24).
var network = map[string]struct{ bridge, subnet string }{
	"1.6": {"kvmbench0", "10.89.20.0/24"},
	"2.x": {"kvmbench1", "10.89.21.0/24"},
}

// env is everything the benchmark set up: one work directory under /run,
// the shim binaries in it, and one private containerd per flavour.
type env struct {
	work    string // /run/kvm-bench-<pid>, mode 0755
	binDir  string
	rawDir  string // files of the go-libvirt baseline domains
	cfg     *config
	daemons []*daemon
	// keepWork keeps the work dir at the end: something was left behind
	// and its logs explain why.
	keepWork bool
}

// daemon is one private containerd and the images imported into it.
type daemon struct {
	*testenv.Containerd
	kernelRef, pauseRef string
}

func (d *daemon) name() string { return d.Flavour.Name }

// shimConfig is the kvm shim's TOML for the benchmark (testenv adds
// libvirt_uri and state_dir). cpu_threshold is raised from 4 to 32
// floating vCPUs per host CPU so that the density round's 20 and the
// memory section's 50 one-vCPU guests (issue 27's node cost at 50 pods)
// fit the 2 CPUs of this host's only NUMA node; mem_threshold stays
// at 1 (no memory overcommit). The NUMA reservations go to a file of this
// daemon: the host's shared one (/run/containerd-shim-kvm-v1/numa.json)
// may hold other users' VMs.
func shimConfig(binDir, daemonDir string, c *config) string {
	return fmt.Sprintf(`accel = "tcg"
qemu_wrapper = %q
default_vcpus = %d
default_memory_mib = %d
cpu_threshold = 32.0
numa_state_file = %q
`, filepath.Join(binDir, wrapperBinary), c.vcpus, c.memoryMiB, filepath.Join(daemonDir, "numa.json"))
}

// lockHost serialises benchmark runs on this host: it waits while another
// run holds the lock.
func lockHost() (unlock func(), err error) {
	f, err := os.OpenFile(hostLockPath, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		logf("waiting for another benchmark run to release %s", hostLockPath)
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", hostLockPath, err)
		}
	}
	return func() { f.Close() }, nil
}

// setup makes the work dir, copies the shim binaries into it and starts
// one containerd per flavour with the guest images imported. On error the
// returned env must still be closed.
func setup(ctx context.Context, c *config) (*env, error) {
	e := &env{cfg: c, work: fmt.Sprintf("/run/kvm-bench-%d", os.Getpid())}
	e.binDir = filepath.Join(e.work, "bin")
	e.rawDir = filepath.Join(e.work, "raw")
	for _, d := range []string{e.work, e.binDir, e.rawDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return e, err
		}
		if err := os.Chmod(d, 0o755); err != nil {
			return e, err
		}
	}
	for _, b := range []string{shimBinary, wrapperBinary} {
		if err := copyFile(filepath.Join(c.binDir, b), filepath.Join(e.binDir, b), 0o755); err != nil {
			return e, fmt.Errorf("%w (build the shim first: make build)", err)
		}
	}
	images := map[string]string{}
	for _, name := range []string{"kernel", "pause"} {
		p := filepath.Join(c.imagesDir, name+".tar")
		if _, err := os.Stat(p); err != nil {
			return e, fmt.Errorf("%w (build the guest images first: hack/guest/build.sh)", err)
		}
		images[name] = p
	}
	for _, name := range c.flavours {
		f, err := testenv.LookupFlavour(name)
		if err != nil {
			return e, err
		}
		n := network[name]
		logf("starting containerd %s", name)
		dir := filepath.Join(e.work, "containerd-"+name)
		ctd, err := testenv.Start(ctx, f, testenv.Options{
			Dir:          dir,
			PathPrefix:   e.binDir,
			ShimConfig:   shimConfig(e.binDir, dir, c),
			SandboxImage: "localhost/kvm-guest/pause:latest",
			Bridge:       n.bridge,
			Subnet:       n.subnet,
			LogLevel:     map[bool]string{true: "debug", false: "info"}[c.debug],
		})
		if ctd != nil {
			e.daemons = append(e.daemons, &daemon{Containerd: ctd})
		}
		if err != nil {
			return e, err
		}
		d := e.daemons[len(e.daemons)-1]
		if d.pauseRef, err = ctd.Import(ctx, images["pause"], testenv.NamespaceDefault, testenv.NamespaceCRI); err != nil {
			return e, err
		}
		if d.kernelRef, err = ctd.Import(ctx, images["kernel"], testenv.NamespaceDefault, testenv.NamespaceCRI); err != nil {
			return e, err
		}
	}
	return e, nil
}

// close stops the daemons and removes the work dir (kept with -keep or
// when something was left behind, for a look).
func (e *env) close(keep bool) error {
	var errs []error
	for _, d := range e.daemons {
		if left := d.ForceCleanup(context.Background()); len(left) > 0 {
			errs = append(errs, fmt.Errorf("containerd %s: removed leftovers at the end: %s", d.name(), strings.Join(left, "; ")))
		}
		if err := d.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 || keep || e.keepWork {
		logf("work dir kept: %s", e.work)
	} else if err := os.RemoveAll(e.work); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Chmod(dst, mode)
}

// logf prints progress to stderr; stdout carries only the table.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "kvmbench: "+format+"\n", args...)
}
