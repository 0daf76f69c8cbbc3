//go:build integration

package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"text/template"
	"time"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

const (
	nsDefault   = "default"
	nsCRI       = "k8s.io"
	kvmRuntime  = "io.containerd.kvm.v1"
	runcRuntime = "io.containerd.runc.v2"
	shimBinary  = "containerd-shim-kvm-v1"
	cniBinDir   = "/usr/lib/cni"
	cniNetwork  = "kvmtest"
)

// flavour is one containerd release line the shim must work with.
type flavour struct {
	name   string
	bin    string // containerd
	ctr    string // the ctr of the same release
	config *template.Template
	bridge string // private CNI bridge
	subnet string // private CNI subnet, on this machine only
	// mountSetup, when set, is a shell script run in a mount namespace of
	// containerd's own (unshare --mount, private propagation) before it
	// execs containerd: containerd and every shim it starts see what the
	// script changed (e.g. a broken /dev/net/tun); the host does not.
	mountSetup string
}

var flavours = map[string]flavour{
	"1.6": {
		name: "1.6", bin: "/usr/bin/containerd", ctr: "/usr/bin/ctr",
		config: template.Must(template.New("1.6").Parse(configV2)),
		bridge: "kvmtest0", subnet: "10.89.0.0/24",
	},
	"2.x": {
		name: "2.x", bin: "/usr/local/lib/kvm-shim/containerd-v2.2.1/bin/containerd",
		ctr:    "/usr/local/lib/kvm-shim/containerd-v2.2.1/bin/ctr",
		config: template.Must(template.New("2.x").Parse(configV3)),
		bridge: "kvmtest1", subnet: "10.89.1.0/24",
	},
}

// Both configs set restrict_oom_score_adj: this kernel refuses negative
// oom_score_adj values (EIO), and CRI gives sandboxes -998, which made runc
// fail with "can't get final child's PID from pipe: EOF".

// configV2 is the config for containerd 1.6 (config version 2).
const configV2 = `version = 2
root = {{printf "%q" .Root}}
state = {{printf "%q" .State}}

[grpc]
  address = {{printf "%q" .Address}}

[ttrpc]
  address = {{printf "%q" .TTRPCAddress}}

[debug]
  level = "debug"

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = {{printf "%q" .Opt}}

  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = {{printf "%q" .SandboxImage}}
    restrict_oom_score_adj = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"

    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = {{printf "%q" .CNIBinDir}}
      conf_dir = {{printf "%q" .CNIConfDir}}
      max_conf_num = 1

    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kvm]
        runtime_type = "io.containerd.kvm.v1"
        pod_annotations = ["kvm.containerd.io/*"]
        container_annotations = ["kvm.containerd.io/*"]

        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kvm.options]
          ConfigPath = {{printf "%q" .ShimConfig}}
`

// configV3 is the config for containerd 2.x (config version 3): CRI is split
// into io.containerd.cri.v1.images and io.containerd.cri.v1.runtime.
const configV3 = `version = 3
root = {{printf "%q" .Root}}
state = {{printf "%q" .State}}
imports = []

[grpc]
  address = {{printf "%q" .Address}}

[ttrpc]
  address = {{printf "%q" .TTRPCAddress}}

[debug]
  level = "debug"

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = {{printf "%q" .Opt}}

  [plugins."io.containerd.nri.v1.nri"]
    disable = true

  [plugins."io.containerd.grpc.v1.cri"]
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"

  [plugins."io.containerd.cri.v1.images"]
    [plugins."io.containerd.cri.v1.images".pinned_images]
      sandbox = {{printf "%q" .SandboxImage}}

  [plugins."io.containerd.cri.v1.runtime"]
    netns_mounts_under_state_dir = true
    restrict_oom_score_adj = true

    [plugins."io.containerd.cri.v1.runtime".cni]
      bin_dirs = [{{printf "%q" .CNIBinDir}}]
      conf_dir = {{printf "%q" .CNIConfDir}}
      max_conf_num = 1

    [plugins."io.containerd.cri.v1.runtime".containerd]
      default_runtime_name = "runc"

      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.kvm]
        runtime_type = "io.containerd.kvm.v1"
        pod_annotations = ["kvm.containerd.io/*"]
        container_annotations = ["kvm.containerd.io/*"]

        [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.kvm.options]
          ConfigPath = {{printf "%q" .ShimConfig}}
`

// cniConfList is the private pod network: a bridge only on this machine,
// which is the pods' default gateway (as on a real node, where pods have a
// default route; the VM tests check that the guest gets it).
const cniConfList = `{
  "cniVersion": "1.0.0",
  "name": {{printf "%q" .CNINetwork}},
  "plugins": [
    {
      "type": "bridge",
      "bridge": {{printf "%q" .Bridge}},
      "isGateway": true,
      "isDefaultGateway": true,
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "dataDir": {{printf "%q" .IPAMDir}},
        "ranges": [[{"subnet": {{printf "%q" .Subnet}}}]]
      }
    },
    {"type": "loopback"}
  ]
}
`

var cniTemplate = template.Must(template.New("cni").Parse(cniConfList))

// shimConfig is the kvm shim's own config, passed as runtime option ConfigPath.
//
// The host is shared: a shim that starts adopts the NUMA placement of every
// live VM on the node into its store, other people's too (a benchmark's ten
// VMs fill a 2-CPU node at the default cpu_threshold of 4). Generous
// thresholds keep the suite's VMs placeable whatever else runs; placement
// itself (node and dedicated) is still checked by TestCtrNUMA.
const shimConfig = `libvirt_uri = "qemu:///system"
accel = "tcg"
state_dir = {{printf "%q" .ShimState}}
qemu_wrapper = {{printf "%q" .QEMUWrapper}}
numa_state_file = {{printf "%q" .NUMAStateFile}}
cpu_threshold = 100.0
mem_threshold = 16.0
default_vcpus = 1
default_memory_mib = 256
`

var shimTemplate = template.Must(template.New("shim").Parse(shimConfig))

// containerd is one private containerd instance started by the suite.
type containerd struct {
	flavour

	Dir          string
	Root         string
	State        string
	Opt          string
	Address      string
	TTRPCAddress string
	SandboxImage string
	CNIBinDir    string
	CNIConfDir   string
	CNINetwork   string
	IPAMDir      string
	Bridge       string
	Subnet       string
	ShimConfig   string // path of kvm-shim.toml
	ShimState    string // the shim's state_dir
	QEMUWrapper  string // the shim's qemu_wrapper, built by the suite
	// NUMAStateFile is the shim's numa_state_file: this containerd's own,
	// so the suite's reservations neither meet nor disturb the node's.
	NUMAStateFile string
	ConfigPath    string
	LogPath       string

	cmd     *exec.Cmd
	exited  chan struct{} // closed when the process has been reaped
	waitErr error         // set before exited is closed
	suite   *testSuite

	seenMu      sync.Mutex
	seenDomains map[string]bool // domains seen to be this containerd's; guarded by seenMu
}

func startContainerd(s *testSuite, f flavour) (*containerd, error) {
	dir := filepath.Join(s.tmp, f.name)
	c := &containerd{
		flavour:       f,
		Dir:           dir,
		Root:          filepath.Join(dir, "root"),
		State:         filepath.Join(dir, "state"),
		Opt:           filepath.Join(dir, "opt"),
		Address:       filepath.Join(dir, "containerd.sock"),
		TTRPCAddress:  filepath.Join(dir, "containerd.sock.ttrpc"),
		SandboxImage:  sandboxImage,
		CNIBinDir:     cniBinDir,
		CNIConfDir:    filepath.Join(dir, "cni", "net.d"),
		CNINetwork:    cniNetwork,
		IPAMDir:       filepath.Join(dir, "cni", "ipam"),
		Bridge:        f.bridge,
		Subnet:        f.subnet,
		ShimConfig:    filepath.Join(dir, "kvm-shim.toml"),
		ShimState:     filepath.Join(dir, "shim-state"),
		QEMUWrapper:   s.wrapper,
		NUMAStateFile: filepath.Join(dir, "numa", "numa.json"),
		ConfigPath:    filepath.Join(dir, "config.toml"),
		LogPath:       filepath.Join(dir, "containerd.log"),
		suite:         s,
	}
	if err := os.MkdirAll(c.CNIConfDir, 0o755); err != nil {
		return nil, err
	}
	for path, tmpl := range map[string]*template.Template{
		c.ConfigPath: f.config,
		c.ShimConfig: shimTemplate,
		filepath.Join(c.CNIConfDir, "10-kvmtest.conflist"): cniTemplate,
	} {
		if err := renderFile(path, tmpl, c); err != nil {
			return nil, err
		}
	}

	logf, err := os.Create(c.LogPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	argv := []string{f.bin, "--config", c.ConfigPath}
	if f.mountSetup != "" {
		argv = append([]string{"unshare", "--mount", "--propagation", "private",
			"sh", "-euc", f.mountSetup + "\nexec \"$@\"", "sh"}, argv...)
	}
	c.cmd = exec.Command(argv[0], argv[1:]...)
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	// containerd finds containerd-shim-kvm-v1 through PATH: the fresh build first.
	c.cmd.Env = append(os.Environ(), "PATH="+s.binDir+":"+os.Getenv("PATH"))
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start containerd %s: %w", f.name, err)
	}
	c.exited = make(chan struct{})
	go func() {
		c.waitErr = c.cmd.Wait()
		close(c.exited)
	}()

	err = poll(30*time.Second, func() (bool, string) {
		select {
		case <-c.exited:
			return true, "" // reported below
		default:
		}
		r := c.ctr("", "version")
		return r.err == nil, r.String()
	})
	select {
	case <-c.exited:
		err = fmt.Errorf("exited: %v", c.waitErr)
	default:
	}
	if err != nil {
		return c, fmt.Errorf("containerd %s did not come up: %v\nlog tail:\n%s", f.name, err, c.logTail(0, 40))
	}
	if err := c.waitCRIReady(); err != nil {
		return c, fmt.Errorf("containerd %s: %v\nlog tail:\n%s", f.name, err, c.logTail(0, 40))
	}
	return c, nil
}

func renderFile(path string, t *template.Template, data any) error {
	var b bytes.Buffer
	if err := t.Execute(&b, data); err != nil {
		return err
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

// stop ends containerd, then reports and removes whatever was left under its
// directories: shim processes, mounts, the CNI bridge.
func (c *containerd) stop() error {
	var errs []error
	if c.cmd != nil && c.cmd.Process != nil {
		select {
		case <-c.exited:
			errs = append(errs, fmt.Errorf("containerd %s had exited early: %v", c.name, c.waitErr))
		default:
			_ = c.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-c.exited:
			case <-time.After(30 * time.Second):
				errs = append(errs, fmt.Errorf("containerd %s ignored SIGTERM for 30s; killed", c.name))
				_ = c.cmd.Process.Kill()
				<-c.exited
			}
		}
	}
	for _, p := range c.shimProcesses() {
		errs = append(errs, fmt.Errorf("containerd %s: leftover shim process %d: %s", c.name, p.pid, p.cmdline))
		_ = syscall.Kill(p.pid, syscall.SIGKILL)
	}
	for _, m := range testenv.MountsUnder(c.Dir) {
		errs = append(errs, fmt.Errorf("containerd %s: leftover mount %s", c.name, m))
	}
	if err := testenv.UnmountAll(c.Dir); err != nil {
		errs = append(errs, err)
	}
	// CNI bridges outlive their pods by design; this one is ours to remove.
	if _, err := os.Stat(filepath.Join("/sys/class/net", c.Bridge)); err == nil {
		if out, err := exec.Command("ip", "link", "del", c.Bridge).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip link del %s: %v: %s", c.Bridge, err, out))
		}
	}
	return errors.Join(errs...)
}

// mounts lists the mount points at or below dir that containerd and its
// shims see: in containerd's own mount namespace when it has one.
func (c *containerd) mounts(dir string) []string {
	if c.mountSetup != "" && c.cmd != nil && c.cmd.Process != nil {
		select {
		case <-c.exited:
		default:
			return testenv.MountsUnderIn(fmt.Sprintf("/proc/%d/mountinfo", c.cmd.Process.Pid), dir)
		}
	}
	return testenv.MountsUnder(dir)
}

// inMountNS runs a shell script in containerd's mount namespace (see
// flavour.mountSetup).
func (c *containerd) inMountNS(script string) error {
	out, err := exec.Command("nsenter", fmt.Sprintf("--mount=/proc/%d/ns/mnt", c.cmd.Process.Pid),
		"sh", "-euc", script).CombinedOutput()
	if err != nil {
		return fmt.Errorf("in the mount namespace of containerd %s: %s: %v: %s", c.name, script, err, out)
	}
	return nil
}

// watch prints what containerd logged during t when t fails.
func (c *containerd) watch(t *testing.T) {
	mark := c.logSize()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("containerd %s log during this test (tail):\n%s", c.name, c.logTail(mark, 80))
		}
	})
}

func (c *containerd) logSize() int64 {
	fi, err := os.Stat(c.LogPath)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// logTail returns the last n lines logged after byte offset from.
func (c *containerd) logTail(from int64, n int) string {
	b, err := os.ReadFile(c.LogPath)
	if err != nil {
		return err.Error()
	}
	if from > int64(len(b)) {
		from = 0
	}
	return tail(string(b[from:]), n)
}

// result is the outcome of one ctr command.
type result struct {
	args           []string
	stdout, stderr string
	code           int // exit status; -1 if it did not run or was killed
	err            error
}

func (r result) String() string {
	return fmt.Sprintf("ctr %s: exit %d (%v)\nstdout: %s\nstderr: %s",
		strings.Join(r.args, " "), r.code, r.err, strings.TrimSpace(r.stdout), strings.TrimSpace(r.stderr))
}

// ctr runs this flavour's ctr against this containerd in namespace ns
// ("" for none) and waits at most two minutes.
func (c *containerd) ctr(ns string, args ...string) result {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := c.ctrCmd(ctx, ns, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{args: cmd.Args[1:], stdout: stdout.String(), stderr: stderr.String(), code: -1, err: err}
	if cmd.ProcessState != nil {
		r.code = cmd.ProcessState.ExitCode()
	}
	return r
}

func (c *containerd) ctrCmd(ctx context.Context, ns string, args ...string) *exec.Cmd {
	full := []string{"--address", c.Address}
	if ns != "" {
		full = append(full, "--namespace", ns)
	}
	return exec.CommandContext(ctx, c.flavour.ctr, append(full, args...)...)
}

// mustCtr runs ctr and fails the test unless it exits 0.
func (c *containerd) mustCtr(t *testing.T, ns string, args ...string) result {
	t.Helper()
	r := c.ctr(ns, args...)
	if r.err != nil {
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
