package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// DefaultEtcd is Debian's etcd-server.
const DefaultEtcd = "/usr/bin/etcd"

// Ports are the TCP ports of the cluster's components, on 127.0.0.1 or
// the node IP. Pick ports nothing else on the host uses.
type Ports struct {
	EtcdClient, EtcdPeer       int
	APIServer                  int
	ControllerManager          int
	Kubelet, KubeletHealthz    int
	ProxyHealthz, ProxyMetrics int
	Scheduler                  int
}

// DefaultPorts are well away from the components' usual ports, so a
// cluster already running on the host is not disturbed.
var DefaultPorts = Ports{
	EtcdClient: 22379, EtcdPeer: 22380,
	APIServer:         26443,
	ControllerManager: 20257,
	Kubelet:           20250, KubeletHealthz: 20248,
	ProxyHealthz: 20256, ProxyMetrics: 20249,
	Scheduler: 20259,
}

// Options describe one cluster.
type Options struct {
	// Dir holds everything of the cluster: PKI, configs, etcd data,
	// kubelet's root dir, pod logs, component logs.
	Dir string
	// BinDir holds kube-apiserver, kube-controller-manager, kubelet,
	// kube-proxy and kubectl (hack/k8s/build.sh).
	BinDir string
	// Etcd is the etcd binary; "" means DefaultEtcd.
	Etcd string
	// Node is the node's name.
	Node string
	// NodeLink is a network link Start creates to carry NodeIP: the
	// apiserver refuses to proxy to a loopback address, so the node
	// needs another one. Pick a name and address no one else uses.
	NodeLink string
	NodeIP   net.IP
	// ServiceCIDR is the Service ClusterIP range, PodCIDR the CNI network's
	// subnet (kube-proxy's clusterCIDR). Neither may overlap a network
	// the host uses.
	ServiceCIDR, PodCIDR string
	// CRISocket is the path of containerd's socket.
	CRISocket string
	// Ports; zero means DefaultPorts.
	Ports Ports
	// Scheduler starts kube-scheduler (BinDir must hold it); without it
	// pods must name their node.
	Scheduler bool
	// StartTimeout bounds the whole start; 0 means three minutes (the
	// apiserver's first start on a loaded host takes a while).
	StartTimeout time.Duration
	// Nodes are further nodes, each with its own kubelet and containerd;
	// their kubelets start right after the first node's.
	Nodes []Node
}

// Cluster is a started cluster.
type Cluster struct {
	Options
	PKI        *PKI
	PodLogsDir string
	KubeletDir string // kubelet's root dir
	// Kubeconfig is the admin's (system:masters) kubeconfig.
	Kubeconfig string

	etcd, apiserver, controllerManager, kubelet, kubeProxy *process
	scheduler                                              *process       // nil unless Options.Scheduler
	nodes                                                  []*kubeletNode // the first node's kubelet, then Options.Nodes'
	linkMade                                               bool
	sysctls                                                map[string]string // the host's, before kubelet changed them
}

// Start lays out the cluster below o.Dir and starts etcd, the apiserver,
// the controller manager, every node's kubelet (registering in parallel),
// kube-proxy and the scheduler, waiting for each; it returns once every
// node is Ready and the default service account exists.
// On error the returned Cluster, if not nil, must still be stopped.
func Start(ctx context.Context, o Options) (*Cluster, error) {
	if err := o.complete(); err != nil {
		return nil, err
	}
	_, svcNet, err := net.ParseCIDR(o.ServiceCIDR)
	if err != nil {
		return nil, fmt.Errorf("kube: ServiceCIDR: %w", err)
	}
	// The kubernetes Service takes the range's first address.
	serviceIP := make(net.IP, 4)
	copy(serviceIP, svcNet.IP.To4())
	serviceIP[3]++

	c := &Cluster{
		Options:    o,
		PodLogsDir: filepath.Join(o.Dir, "pod-logs"),
		KubeletDir: filepath.Join(o.Dir, "kubelet"),
		Kubeconfig: filepath.Join(o.Dir, "admin.kubeconfig"),
	}
	if err = mkdirs(o.Dir, filepath.Join(o.Dir, "etcd")); err != nil {
		return nil, err
	}
	if c.PKI, err = newPKI(filepath.Join(o.Dir, "pki"), o.Node, o.NodeIP, serviceIP); err != nil {
		return nil, err
	}
	if err = c.layoutNodes(); err != nil {
		return nil, err
	}
	if err = c.prepareHost(); err != nil {
		return c, err
	}
	ctx, cancel := context.WithTimeout(ctx, o.StartTimeout)
	defer cancel()

	// A step starts a process and waits until ready passes; one without
	// a process (p nil) runs ready alone.
	type step struct {
		p     **process
		make  func() *process
		ready func(context.Context) error
	}
	steps := []step{
		{&c.etcd, c.etcdProcess, c.etcdReady},
		{&c.apiserver, c.apiserverProcess, c.apiserverReady},
		{&c.controllerManager, c.controllerManagerProcess, nil},
		{nil, nil, c.startKubelets},
		{&c.kubeProxy, c.kubeProxyProcess, nil},
	}
	if o.Scheduler {
		steps = append(steps, step{&c.scheduler, c.schedulerProcess, nil})
	}
	for _, s := range steps {
		if s.p == nil {
			if err := s.ready(ctx); err != nil {
				return c, err
			}
			continue
		}
		p := s.make()
		*s.p = p
		if err := p.start(); err != nil {
			return c, err
		}
		if s.ready == nil {
			continue
		}
		if err := c.waitFor(ctx, p, s.ready); err != nil {
			return c, err
		}
	}
	if err := c.waitFor(ctx, c.controllerManager, c.defaultServiceAccount); err != nil {
		return c, err
	}
	return c, nil
}

// complete checks the options and fills in the defaults.
func (o *Options) complete() error {
	if o.Dir == "" || !filepath.IsAbs(o.Dir) {
		return fmt.Errorf("kube: Options.Dir %q must be an absolute path", o.Dir)
	}
	if o.Node == "" || o.NodeLink == "" || o.NodeIP.To4() == nil || o.ServiceCIDR == "" || o.PodCIDR == "" || o.CRISocket == "" {
		return errors.New("kube: Options.Node, NodeLink, NodeIP (IPv4), ServiceCIDR, PodCIDR and CRISocket are required")
	}
	if o.Etcd == "" {
		o.Etcd = DefaultEtcd
	}
	if o.Ports == (Ports{}) {
		o.Ports = DefaultPorts
	}
	if err := o.checkNodes(); err != nil {
		return err
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 3 * time.Minute
	}
	bins := []string{o.Etcd, o.bin("kube-apiserver"), o.bin("kube-controller-manager"), o.bin("kubelet"), o.bin("kube-proxy"),
		o.bin("kubectl")}
	if o.Scheduler {
		bins = append(bins, o.bin("kube-scheduler"))
	}
	for _, bin := range bins {
		if _, err := os.Stat(bin); err != nil {
			return fmt.Errorf("kube: %w (hack/k8s/build.sh builds the Kubernetes binaries; hack/setup-host.sh installs etcd-server)", err)
		}
	}
	return nil
}

func (o Options) bin(name string) string { return filepath.Join(o.BinDir, name) }

func (c *Cluster) kubeconfigPath(user string) string {
	return filepath.Join(c.Dir, user+".kubeconfig")
}

func (c *Cluster) writeConfigs() error {
	server := fmt.Sprintf("https://127.0.0.1:%d", c.Ports.APIServer)
	for user, p := range map[string]pair{
		"admin": c.PKI.Admin, "controller-manager": c.PKI.ControllerManager,
		"kubelet": c.PKI.Kubelet, "kube-proxy": c.PKI.KubeProxy, "scheduler": c.PKI.Scheduler,
	} {
		if err := writeKubeconfig(c.kubeconfigPath(user), server, c.PKI.CA, p); err != nil {
			return err
		}
	}
	for _, n := range c.nodes[1:] {
		if err := writeKubeconfig(n.kubeconfig, server, c.PKI.CA, n.client); err != nil {
			return err
		}
	}
	for _, n := range c.nodes {
		if err := writeJSON(n.configPath, c.kubeletConfig(n)); err != nil {
			return err
		}
	}
	return writeJSON(filepath.Join(c.Dir, "kube-proxy.json"), c.kubeProxyConfig())
}

// makeLink creates the node's link with NodeIP; a link of that name
// left by an earlier run that died is replaced.
func (c *Cluster) makeLink() error {
	if _, err := os.Stat(filepath.Join("/sys/class/net", c.NodeLink)); err == nil {
		if err := run("ip", "link", "del", c.NodeLink); err != nil {
			return err
		}
	}
	// A bridge without ports: the dummy link type is a module this
	// machine's kernel lacks, the bridge one CNI loads anyway. The address
	// is local whether or not the link has a carrier.
	if err := run("ip", "link", "add", c.NodeLink, "type", "bridge"); err != nil {
		return err
	}
	c.linkMade = true
	for _, n := range c.nodes {
		if err := run("ip", "addr", "add", n.ip.String()+"/32", "dev", c.NodeLink); err != nil {
			return err
		}
	}
	return run("ip", "link", "set", c.NodeLink, "up")
}

// prepareHost makes the node link and the nodes' cgroup roots, saves the
// kernel settings kubelet changes and writes every config file.
func (c *Cluster) prepareHost() error {
	if err := c.makeLink(); err != nil {
		return err
	}
	for _, n := range c.nodes {
		if err := makeCgroupRoot(n.cgroupRoot); err != nil {
			return err
		}
	}
	c.sysctls = saveSysctls()
	return c.writeConfigs()
}

func mkdirs(dirs ...string) error {
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	return nil
}

func run(argv ...string) error {
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(argv, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

func (c *Cluster) newProcess(name string, argv ...string) *process {
	return &process{name: name, argv: argv, logPath: c.LogPath(name)}
}

// LogPath is the log file of a component: etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, kubelet (the first node's),
// kubelet-<node> (a further node's) or kube-proxy.
func (c *Cluster) LogPath(component string) string {
	return filepath.Join(c.Dir, component+".log")
}

func (c *Cluster) etcdProcess() *process {
	client := fmt.Sprintf("http://127.0.0.1:%d", c.Ports.EtcdClient)
	peer := fmt.Sprintf("http://127.0.0.1:%d", c.Ports.EtcdPeer)
	return c.newProcess("etcd", c.Etcd,
		"--name", "e2e",
		"--data-dir", filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "e2e="+peer,
		"--log-level", "warn", "--logger", "zap")
}

func (c *Cluster) apiserverProcess() *process {
	p := c.PKI
	return c.newProcess("kube-apiserver", c.bin("kube-apiserver"),
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", c.Ports.EtcdClient),
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", c.Ports.APIServer),
		"--advertise-address="+c.NodeIP.String(),
		"--service-cluster-ip-range="+c.ServiceCIDR,
		"--client-ca-file="+p.CA,
		"--tls-cert-file="+p.APIServer.Cert, "--tls-private-key-file="+p.APIServer.Key,
		"--kubelet-client-certificate="+p.APIServerKubelet.Cert, "--kubelet-client-key="+p.APIServerKubelet.Key,
		"--kubelet-certificate-authority="+p.CA,
		"--kubelet-preferred-address-types=InternalIP",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+p.ServiceAccountPub,
		"--service-account-signing-key-file="+p.ServiceAccountKey,
		"--authorization-mode=Node,RBAC",
		// The node installer's DaemonSet is privileged (devices for check).
		"--allow-privileged=true",
		"--enable-admission-plugins=NodeRestriction",
		"--profiling=false",
		"--v=1")
}

func (c *Cluster) controllerManagerProcess() *process {
	kc := c.kubeconfigPath("controller-manager")
	return c.newProcess("kube-controller-manager", c.bin("kube-controller-manager"),
		"--kubeconfig="+kc, "--authentication-kubeconfig="+kc, "--authorization-kubeconfig="+kc,
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", c.Ports.ControllerManager),
		"--leader-elect=false",
		"--use-service-account-credentials=false",
		"--service-account-private-key-file="+c.PKI.ServiceAccountKey,
		"--root-ca-file="+c.PKI.CA,
		"--profiling=false",
		"--v=1")
}

func (c *Cluster) schedulerProcess() *process {
	kc := c.kubeconfigPath("scheduler")
	return c.newProcess("kube-scheduler", c.bin("kube-scheduler"),
		"--kubeconfig="+kc, "--authentication-kubeconfig="+kc, "--authorization-kubeconfig="+kc,
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", c.Ports.Scheduler),
		"--leader-elect=false",
		"--profiling=false",
		"--v=1")
}

func (c *Cluster) kubeProxyProcess() *process {
	return c.newProcess("kube-proxy", c.bin("kube-proxy"),
		"--config="+filepath.Join(c.Dir, "kube-proxy.json"), "--v=1")
}

// waitFor polls ready until it succeeds, ctx ends, or p or one of also
// exits.
func (c *Cluster) waitFor(ctx context.Context, p *process, ready func(context.Context) error, also ...*process) error {
	var last error
	for {
		for _, q := range append([]*process{p}, also...) {
			if !q.running() {
				return fmt.Errorf("%s exited: %v\nlog tail:\n%s", q.name, q.waitErr, c.LogTail(q.name, 30))
			}
		}
		if last = ready(ctx); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %v: %w\nlog tail:\n%s", p.name, last, ctx.Err(), c.LogTail(p.name, 30))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (c *Cluster) etcdReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/health", c.Ports.EtcdClient), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var h struct {
		Health string `json:"health"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		return err
	}
	if h.Health != "true" {
		return fmt.Errorf("etcd health %q", h.Health)
	}
	return nil
}

func (c *Cluster) apiserverReady(ctx context.Context) error {
	out, err := c.Kubectl(ctx, nil, "get", "--raw", "/readyz")
	if err != nil {
		return err
	}
	if strings.TrimSpace(out) != "ok" {
		return fmt.Errorf("readyz: %s", out)
	}
	return nil
}

// nodeReady checks that the node named node is Ready.
func (c *Cluster) nodeReady(node string) func(context.Context) error {
	return func(ctx context.Context) error {
		out, err := c.Kubectl(ctx, nil, "get", "node", node, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		if err != nil {
			return err
		}
		if out != "True" {
			return fmt.Errorf("node %s Ready=%q", node, out)
		}
		return nil
	}
}

// defaultServiceAccount waits for the controller manager to make the
// default namespace's service account, which pods need to be admitted.
func (c *Cluster) defaultServiceAccount(ctx context.Context) error {
	_, err := c.Kubectl(ctx, nil, "get", "serviceaccount", "default", "-n", "default", "-o", "name")
	return err
}

// Kubectl runs the cluster's kubectl as the admin with stdin (nil for
// none) and returns its stdout; the error carries stderr.
func (c *Cluster) Kubectl(ctx context.Context, stdin []byte, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cmd := c.KubectlCmd(ctx, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// KubectlCmd returns, unstarted, the cluster's kubectl as the admin.
func (c *Cluster) KubectlCmd(ctx context.Context, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, c.bin("kubectl"), append([]string{"--kubeconfig=" + c.Kubeconfig}, args...)...)
}

// Apply applies objects (Go values that marshal to Kubernetes objects).
func (c *Cluster) Apply(ctx context.Context, objects ...any) error {
	for _, o := range objects {
		b, err := json.Marshal(o)
		if err != nil {
			return err
		}
		if _, err := c.Kubectl(ctx, b, "apply", "-f", "-"); err != nil {
			return err
		}
	}
	return nil
}

// RestartKubelet stops the first node's kubelet (SIGTERM) and starts it again with the same
// configuration, then waits for the node to be Ready.
func (c *Cluster) RestartKubelet(ctx context.Context) error {
	if err := c.kubelet.stop(30 * time.Second); err != nil {
		return err
	}
	c.kubelet = c.kubeletProcess(c.nodes[0])
	c.nodes[0].proc = c.kubelet
	if err := c.kubelet.start(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.StartTimeout)
	defer cancel()
	return c.waitFor(ctx, c.kubelet, c.nodeReady(c.Node))
}

// LogSize is a component log's current size, a mark for LogSince.
func (c *Cluster) LogSize(component string) int64 {
	fi, err := os.Stat(c.LogPath(component))
	if err != nil {
		return 0
	}
	return fi.Size()
}

// LogSince returns what a component logged after byte offset from.
func (c *Cluster) LogSince(component string, from int64) string {
	b, err := os.ReadFile(c.LogPath(component))
	if err != nil {
		return err.Error()
	}
	if from > int64(len(b)) {
		from = 0
	}
	return string(b[from:])
}

// LogTail returns the last n lines of a component's log.
func (c *Cluster) LogTail(component string, n int) string {
	lines := strings.Split(strings.TrimRight(c.LogSince(component, 0), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Stop stops kube-proxy (and removes its iptables rules), every node's
// kubelet, the scheduler, the controller manager, the apiserver and etcd,
// each by its pid, then unmounts what the kubelets left mounted below
// their root dirs, removes their iptables chains and their cgroups (each
// node's cgroup root), puts back the kernel settings they changed and
// deletes the nodes' link. Pods should be deleted before: kubelet does not
// stop them when it stops.
func (c *Cluster) Stop() error {
	var errs []error
	if c.kubeProxy != nil {
		errs = append(errs, c.kubeProxy.stop(10*time.Second))
		// kube-proxy leaves its chains in place when it stops.
		cleanup := c.newProcess("kube-proxy-cleanup", c.bin("kube-proxy"), "--cleanup", "--v=1")
		if err := cleanup.start(); err != nil {
			errs = append(errs, err)
		} else {
			<-cleanup.exited
			if cleanup.waitErr != nil {
				errs = append(errs, fmt.Errorf("kube-proxy --cleanup: %v", cleanup.waitErr))
			}
		}
	}
	var started bool
	for _, n := range c.nodes {
		if n.proc != nil {
			started = true
			errs = append(errs, n.proc.stop(30*time.Second))
		}
	}
	errs = append(errs, stopAll(30*time.Second, c.scheduler, c.controllerManager, c.apiserver, c.etcd))
	for _, n := range c.nodes {
		errs = append(errs, testenv.UnmountAll(n.rootDir), removeCgroupRoot(n.cgroupRoot))
	}
	if started {
		errs = append(errs, removeKubeletChains(), restoreSysctls(c.sysctls))
	}
	if c.linkMade {
		errs = append(errs, run("ip", "link", "del", c.NodeLink))
	}
	return errors.Join(errs...)
}

// Pid is the pid of a running component, 0 if it does not run; a
// further node's kubelet is "kubelet-<node>".
func (c *Cluster) Pid(component string) int {
	ps := []*process{c.etcd, c.apiserver, c.controllerManager, c.scheduler, c.kubeProxy}
	for _, n := range c.nodes {
		ps = append(ps, n.proc)
	}
	for _, p := range ps {
		if p != nil && p.name == component && p.running() {
			return p.cmd.Process.Pid
		}
	}
	return 0
}
