package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"text/template"
	"time"
)

// Namespaces the daemons are used with: ctr's default and CRI's.
const (
	NamespaceDefault = "default"
	NamespaceCRI     = "k8s.io"
)

// Runtime names of the two runtimes every daemon declares.
const (
	RuntimeKVM  = "io.containerd.kvm.v1"
	RuntimeRunc = "io.containerd.runc.v2"
)

// HandlerKVMPlain is the CRI runtime handler of the kvm shim with
// plain_containers on (ShimPlainConfigPath), declared beside "kvm".
const HandlerKVMPlain = "kvm-plain"

// DefaultCNIBinDir holds Debian's containernetworking-plugins.
const DefaultCNIBinDir = "/usr/lib/cni"

// Options describe one private containerd.
type Options struct {
	// Dir holds everything of this daemon: config, root, state, socket,
	// logs, the shim's state_dir. It is created with mode 0755: QEMU (the
	// libvirt-qemu user) must be able to search it, and so must every
	// parent directory.
	Dir string
	// PathPrefix is put first in the daemon's PATH; containerd finds shim
	// binaries (containerd-shim-kvm-v1) there.
	PathPrefix string
	// ShimConfig is TOML appended to the kvm shim's config. testenv writes
	// libvirt_uri and state_dir (below Dir) itself; do not repeat them.
	ShimConfig string
	// SandboxImage is CRI's pause image; it must be imported (no registry).
	SandboxImage string
	// Bridge and Subnet name the private CNI network, e.g. "kvmbench0" and
	// "10.89.20.0/24". Pick names no other user of this host picks.
	Bridge, Subnet string
	// CNINetwork is the CNI network's name; "" means "testenv-" + Bridge.
	CNINetwork string
	// DefaultGateway makes the bridge the pods' default gateway (CNI
	// bridge isDefaultGateway), as on a node where pods have a default
	// route.
	DefaultGateway bool
	// CNIBinDir holds the CNI plugins; "" means DefaultCNIBinDir.
	CNIBinDir string
	// LogLevel is containerd's log level; "" means "info".
	LogLevel string
	// StartTimeout bounds the wait for the daemon and CRI to be ready; 0
	// means one minute.
	StartTimeout time.Duration
	// MountSetup, when set, is a shell script run in a mount namespace of
	// the daemon's own (unshare --mount, private propagation) before it
	// execs containerd: the daemon and every shim it starts see what the
	// script changed (e.g. a broken /dev/net/tun); the host does not.
	MountSetup string
	// NoKVMRuntime leaves the kvm runtime out of the daemon's config, as
	// on a node before the shim is installed; Imports (version 3 only)
	// are the config's imports, for the node installer's drop-in.
	NoKVMRuntime bool
	Imports      []string
	// RegistryConfigPath is CRI's registry config_path: a directory of
	// hosts.toml files, one directory per registry host (or _default for
	// every host), that tells containerd where to pull each host's images
	// from. "" leaves it unset: no image is pulled by CRI then, as none
	// can be reached.
	RegistryConfigPath string
	// PortMap chains CNI's portmap plugin after the bridge, so that a
	// pod's host ports (CRI PortMapping) reach it, as on a node.
	PortMap bool
}

// Containerd is one private daemon started by Start.
type Containerd struct {
	Flavour Flavour

	Dir            string
	Root           string
	State          string
	Opt            string
	Address        string // gRPC socket (CRI and containerd's API)
	TTRPCAddress   string
	DebugAddress   string // debug socket: expvar and pprof over HTTP
	ConfigPath     string
	LogPath        string
	ShimConfigPath string // the kvm shim's TOML (runtime option ConfigPath)
	// ShimPlainConfigPath is ShimConfigPath's content plus
	// plain_containers = true: the config of CRI handler HandlerKVMPlain.
	ShimPlainConfigPath string
	ShimStateDir        string // the kvm shim's state_dir
	SandboxImage        string
	CNIBinDir           string
	CNIConfDir          string
	CNINetwork          string
	IPAMDir             string
	Bridge              string
	Subnet              string
	DefaultGateway      bool
	LogLevel            string
	MountSetup          string
	NoKVMRuntime        bool
	Imports             []string
	RegistryConfig      string // Options.RegistryConfigPath
	PortMap             bool

	argv, env    []string // the daemon's command line and environment
	startTimeout time.Duration

	cmd     *exec.Cmd
	exited  chan struct{} // closed once the process is reaped
	waitErr error         // set before exited is closed
}

// runcShimDir makes a directory below daemonDir that holds only a link
// to shim as containerd-shim-runc-v2, for the front of the daemon's PATH:
// the daemon finds its own release's runc shim, and nothing else in the
// shim's directory (runc itself, say) moves ahead of the caller's PATH.
func runcShimDir(daemonDir, shim string) (string, error) {
	if _, err := os.Stat(shim); err != nil {
		return "", fmt.Errorf("runc shim: %w (hack/setup-host.sh installs it)", err)
	}
	dir := filepath.Join(daemonDir, "runc-shim")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	link := filepath.Join(dir, "containerd-shim-runc-v2")
	if err := os.Remove(link); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	return dir, os.Symlink(shim, link)
}

// Start writes the configs below o.Dir, starts the daemon and waits until it
// answers and CRI reports the runtime and the network ready. On error the
// returned Containerd, if not nil, must still be stopped.
func Start(ctx context.Context, f Flavour, o Options) (*Containerd, error) {
	if o.Dir == "" || !filepath.IsAbs(o.Dir) {
		return nil, fmt.Errorf("testenv: Options.Dir %q must be an absolute path", o.Dir)
	}
	if o.Bridge == "" || o.Subnet == "" || o.SandboxImage == "" {
		return nil, errors.New("testenv: Options.Bridge, Subnet and SandboxImage are required")
	}
	for _, bin := range []string{f.Containerd, f.Ctr} {
		if _, err := os.Stat(bin); err != nil {
			return nil, fmt.Errorf("containerd %s: %w (hack/setup-host.sh installs it)", f.Name, err)
		}
	}
	c := newContainerd(f, o)
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.Chmod(o.Dir, 0o755); err != nil {
		return nil, err
	}
	if err := c.writeConfigs(o.ShimConfig); err != nil {
		return nil, err
	}

	argv := []string{f.Containerd, "--config", c.ConfigPath}
	if c.MountSetup != "" {
		argv = append([]string{"unshare", "--mount", "--propagation", "private",
			"sh", "-euc", c.MountSetup + "\nexec \"$@\"", "sh"}, argv...)
	}
	path := os.Getenv("PATH")
	if f.RuncShim != "" {
		dir, err := runcShimDir(o.Dir, f.RuncShim)
		if err != nil {
			return nil, err
		}
		path = dir + ":" + path
	}
	if o.PathPrefix != "" {
		path = o.PathPrefix + ":" + path
	}
	c.argv, c.env = argv, append(os.Environ(), "PATH="+path)
	if err := c.launch(); err != nil {
		return nil, err
	}

	timeout := o.StartTimeout
	if timeout == 0 {
		timeout = time.Minute
	}
	c.startTimeout = timeout
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := c.waitReady(ctx); err != nil {
		return c, fmt.Errorf("containerd %s did not get ready: %w\nlog tail:\n%s", f.Name, err, c.LogTail(0, 40))
	}
	return c, nil
}

// launch starts the daemon process, appending to its log.
func (c *Containerd) launch() error {
	logf, err := os.OpenFile(c.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(c.argv[0], c.argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = c.env
	// Its own process group: a ^C to the caller must not kill the daemon
	// before the caller has cleaned up through it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start containerd %s: %w", c.Flavour.Name, err)
	}
	exited := make(chan struct{})
	c.cmd, c.exited = cmd, exited
	go func() {
		c.waitErr = cmd.Wait()
		close(exited)
	}()
	return nil
}

// Restart stops the daemon with SIGTERM, as an upgrade on a node does
// (its shims, and so their tasks, keep running), starts it again with the
// same configuration and waits until it is ready.
func (c *Containerd) Restart(ctx context.Context) error {
	if c.Exited() {
		return fmt.Errorf("containerd %s had exited: %v", c.Flavour.Name, c.waitErr)
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(30 * time.Second):
		return fmt.Errorf("containerd %s ignored SIGTERM for 30s", c.Flavour.Name)
	}
	return c.Relaunch(ctx)
}

// Crash kills the daemon with SIGKILL, as a power loss or the OOM killer
// does, and reaps it. Its shims are left alone.
func (c *Containerd) Crash() error {
	if c.Exited() {
		return fmt.Errorf("containerd %s had exited: %v", c.Flavour.Name, c.waitErr)
	}
	_ = c.cmd.Process.Kill()
	<-c.exited
	return nil
}

// Relaunch starts the daemon again after Crash or a stop, with the same
// configuration, and waits until it is ready.
func (c *Containerd) Relaunch(ctx context.Context) error {
	if !c.Exited() {
		return fmt.Errorf("containerd %s is still running", c.Flavour.Name)
	}
	if err := c.launch(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.startTimeout)
	defer cancel()
	if err := c.waitReady(ctx); err != nil {
		return fmt.Errorf("containerd %s did not get ready after a restart: %w\nlog tail:\n%s", c.Flavour.Name, err, c.LogTail(0, 40))
	}
	return nil
}

// newContainerd lays out the daemon o describes; it creates nothing.
func newContainerd(f Flavour, o Options) *Containerd {
	c := &Containerd{
		Flavour:             f,
		Dir:                 o.Dir,
		Root:                filepath.Join(o.Dir, "root"),
		State:               filepath.Join(o.Dir, "state"),
		Opt:                 filepath.Join(o.Dir, "opt"),
		Address:             filepath.Join(o.Dir, "containerd.sock"),
		TTRPCAddress:        filepath.Join(o.Dir, "containerd.sock.ttrpc"),
		DebugAddress:        filepath.Join(o.Dir, "debug.sock"),
		ConfigPath:          filepath.Join(o.Dir, "config.toml"),
		LogPath:             filepath.Join(o.Dir, "containerd.log"),
		ShimConfigPath:      filepath.Join(o.Dir, "kvm-shim.toml"),
		ShimPlainConfigPath: filepath.Join(o.Dir, "kvm-shim-plain.toml"),
		ShimStateDir:        filepath.Join(o.Dir, "shim-state"),
		SandboxImage:        o.SandboxImage,
		CNIBinDir:           o.CNIBinDir,
		CNIConfDir:          filepath.Join(o.Dir, "cni", "net.d"),
		CNINetwork:          o.CNINetwork,
		IPAMDir:             filepath.Join(o.Dir, "cni", "ipam"),
		Bridge:              o.Bridge,
		Subnet:              o.Subnet,
		DefaultGateway:      o.DefaultGateway,
		LogLevel:            o.LogLevel,
		MountSetup:          o.MountSetup,
		NoKVMRuntime:        o.NoKVMRuntime,
		Imports:             o.Imports,
		RegistryConfig:      o.RegistryConfigPath,
		PortMap:             o.PortMap,
	}
	if c.CNIBinDir == "" {
		c.CNIBinDir = DefaultCNIBinDir
	}
	if c.CNINetwork == "" {
		c.CNINetwork = "testenv-" + o.Bridge
	}
	if c.LogLevel == "" {
		c.LogLevel = "info"
	}
	return c
}

func (c *Containerd) writeConfigs(shimExtra string) error {
	if err := os.MkdirAll(c.CNIConfDir, 0o755); err != nil {
		return err
	}
	files := []struct {
		path string
		tmpl *template.Template
		data any
	}{
		{c.ConfigPath, configTemplate, c.configData()},
		{filepath.Join(c.CNIConfDir, "10-testenv.conflist"), cniTemplate, c},
		{c.ShimConfigPath, shimHeadTemplate, c},
	}
	for _, f := range files {
		var b bytes.Buffer
		if err := f.tmpl.Execute(&b, f.data); err != nil {
			return fmt.Errorf("render %s: %w", f.path, err)
		}
		if f.path == c.ShimConfigPath && shimExtra != "" {
			b.WriteString(strings.TrimSpace(shimExtra) + "\n")
		}
		if err := os.WriteFile(f.path, b.Bytes(), 0o644); err != nil {
			return err
		}
		if f.path == c.ShimConfigPath {
			b.WriteString("plain_containers = true\n")
			if err := os.WriteFile(c.ShimPlainConfigPath, b.Bytes(), 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// waitReady polls until ctr reaches the daemon and CRI is ready.
func (c *Containerd) waitReady(ctx context.Context) error {
	err := Poll(ctx, 100*time.Millisecond, func() (bool, string) {
		if c.Exited() {
			return true, ""
		}
		r := c.Ctr(ctx, "", "version")
		return r.Err == nil, r.String()
	})
	if c.Exited() {
		return fmt.Errorf("exited: %v", c.waitErr)
	}
	if err != nil {
		return err
	}
	cl, err := c.DialCRI()
	if err != nil {
		return err
	}
	defer cl.Close()
	return cl.WaitReady(ctx)
}

// Exited reports whether the daemon process has ended.
func (c *Containerd) Exited() bool {
	if c.exited == nil {
		return false
	}
	select {
	case <-c.exited:
		return true
	default:
		return false
	}
}

// Pid is the daemon's process id, 0 before it started.
func (c *Containerd) Pid() int {
	if c.cmd == nil || c.cmd.Process == nil {
		return 0
	}
	return c.cmd.Process.Pid
}

// Stop ends the daemon (SIGTERM, then SIGKILL after 30 s), then kills and
// reports shim processes still serving it, reports and unmounts what is
// left mounted below Dir and deletes the CNI bridge. It does not remove
// Dir: the caller decides whether logs are kept. Errors list what had to be
// cleaned up.
func (c *Containerd) Stop() error {
	var errs []error
	if c.cmd != nil && c.cmd.Process != nil {
		select {
		case <-c.exited:
			errs = append(errs, fmt.Errorf("containerd %s had exited early: %v", c.Flavour.Name, c.waitErr))
		default:
			_ = c.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-c.exited:
			case <-time.After(30 * time.Second):
				errs = append(errs, fmt.Errorf("containerd %s ignored SIGTERM for 30s; killed", c.Flavour.Name))
				_ = c.cmd.Process.Kill()
				<-c.exited
			}
		}
	}
	for _, p := range c.ShimProcesses() {
		errs = append(errs, fmt.Errorf("containerd %s: leftover shim process %d: %s", c.Flavour.Name, p.Pid, p.Cmdline))
		_ = syscall.Kill(p.Pid, syscall.SIGKILL)
	}
	for _, m := range MountsUnder(c.Dir) {
		errs = append(errs, fmt.Errorf("containerd %s: leftover mount %s", c.Flavour.Name, m))
	}
	if err := UnmountAll(c.Dir); err != nil {
		errs = append(errs, err)
	}
	// CNI bridges outlive their pods by design; this one is ours.
	if _, err := os.Stat(filepath.Join("/sys/class/net", c.Bridge)); err == nil {
		if out, err := exec.Command("ip", "link", "del", c.Bridge).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip link del %s: %v: %s", c.Bridge, err, out))
		}
	}
	return errors.Join(errs...)
}

// LogSize is the daemon log's current size, a mark for LogTail.
func (c *Containerd) LogSize() int64 {
	fi, err := os.Stat(c.LogPath)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// LogTail returns the last n lines the daemon logged after byte offset from.
func (c *Containerd) LogTail(from int64, n int) string {
	b, err := os.ReadFile(c.LogPath)
	if err != nil {
		return err.Error()
	}
	if from > int64(len(b)) {
		from = 0
	}
	return Tail(string(b[from:]), n)
}

// Result is the outcome of one ctr command.
type Result struct {
	Args           []string
	Stdout, Stderr string
	Code           int // exit status; -1 when it did not run or was killed
	Err            error
}

func (r Result) String() string {
	return fmt.Sprintf("ctr %s: exit %d (%v)\nstdout: %s\nstderr: %s",
		strings.Join(r.Args, " "), r.Code, r.Err, strings.TrimSpace(r.Stdout), strings.TrimSpace(r.Stderr))
}

// Ctr runs this flavour's ctr against the daemon in namespace ns ("" for
// ctr's default) and waits for it, at most two minutes.
func (c *Containerd) Ctr(ctx context.Context, ns string, args ...string) Result {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := c.CtrCmd(ctx, ns, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := Result{Args: cmd.Args[1:], Stdout: stdout.String(), Stderr: stderr.String(), Code: -1, Err: err}
	if cmd.ProcessState != nil {
		r.Code = cmd.ProcessState.ExitCode()
	}
	return r
}

// CtrCmd returns, unstarted, ctr with the daemon's address and namespace ns.
func (c *Containerd) CtrCmd(ctx context.Context, ns string, args ...string) *exec.Cmd {
	full := []string{"--address", c.Address}
	if ns != "" {
		full = append(full, "--namespace", ns)
	}
	return exec.CommandContext(ctx, c.Flavour.Ctr, append(full, args...)...)
}

// Import imports an image archive into each namespace and returns the
// image name it carries.
func (c *Containerd) Import(ctx context.Context, archive string, namespaces ...string) (string, error) {
	ref, err := ArchiveImageName(archive)
	if err != nil {
		return "", err
	}
	for _, ns := range namespaces {
		if r := c.Ctr(ctx, ns, "images", "import", archive); r.Err != nil {
			return "", fmt.Errorf("containerd %s: import %s into %s: %v", c.Flavour.Name, archive, ns, r)
		}
	}
	return ref, nil
}

// Version is the daemon's version as `ctr version` reports it (Server).
func (c *Containerd) Version(ctx context.Context) (string, error) {
	r := c.Ctr(ctx, "", "version")
	if r.Err != nil {
		return "", fmt.Errorf("%v", r)
	}
	return serverVersion(r.Stdout)
}

// serverVersion finds the server's Version in `ctr version` output.
func serverVersion(out string) (string, error) {
	_, server, ok := strings.Cut(out, "Server:")
	if !ok {
		return "", fmt.Errorf("ctr version: no Server section: %s", out)
	}
	for _, line := range strings.Split(server, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "Version:"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("ctr version: no server version: %s", out)
}

// Poll calls cond every interval until it reports done or ctx ends; the
// error then carries cond's last detail.
func Poll(ctx context.Context, interval time.Duration, cond func() (done bool, detail string)) error {
	for {
		done, detail := cond()
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %s", ctx.Err(), detail)
		case <-time.After(interval):
		}
	}
}

// Tail returns the last n lines of s.
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
