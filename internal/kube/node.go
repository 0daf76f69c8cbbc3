package kube

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Node is a node beyond the cluster's first: its own kubelet, against its
// own containerd (own root, state and socket), with its own root dir,
// cgroup root, ports and address, registered with the same apiserver and
// placed on by the same scheduler. It runs no kube-proxy: two in one
// network namespace would rewrite each other's iptables chains, and the
// first node's already serves the host.
type Node struct {
	// Name is the node's name.
	Name string
	// IP is the node's address; Start adds it to the cluster's NodeLink.
	IP net.IP
	// CRISocket is the path of the node's containerd socket.
	CRISocket string
	// Dir holds the node's kubelet root dir, its pod logs and its
	// certificates.
	Dir string
	// CgroupRoot is the node's kubelet cgroupRoot in every hierarchy:
	// apart from every other node's.
	CgroupRoot string
	// Labels are the labels the node's kubelet registers it with
	// (--node-labels), as a cluster's provisioning sets them.
	Labels map[string]string
	// KubeletPort and KubeletHealthzPort are the node's kubelet ports.
	KubeletPort, KubeletHealthzPort int
}

// kubeletNode is what one kubelet runs with: the first node's from
// Options, a further one's from its Node.
type kubeletNode struct {
	name              string
	ip                net.IP
	criSocket         string
	rootDir, certDir  string
	podLogsDir        string
	cgroupRoot        string
	configPath        string // its KubeletConfiguration
	kubeconfig        string
	labels            map[string]string
	port, healthzPort int
	client, serving   pair
	proc              *process
}

// component is the name of the node's kubelet in logs and Pid:
// "kubelet" for the first node, "kubelet-<name>" for the others.
func (c *Cluster) component(n *kubeletNode) string {
	if n == c.nodes[0] {
		return "kubelet"
	}
	return "kubelet-" + n.name
}

// layoutNodes lays out the first node below c.Dir and every further one
// below its Node.Dir, with its certificates and kubeconfig.
func (c *Cluster) layoutNodes() error {
	first := &kubeletNode{
		name: c.Node, ip: c.NodeIP, criSocket: c.CRISocket,
		rootDir: c.KubeletDir, certDir: filepath.Join(c.Dir, "kubelet-pki"), podLogsDir: c.PodLogsDir,
		cgroupRoot: CgroupRoot, configPath: filepath.Join(c.Dir, "kubelet.json"), kubeconfig: c.kubeconfigPath("kubelet"),
		port: c.Ports.Kubelet, healthzPort: c.Ports.KubeletHealthz,
		client: c.PKI.Kubelet, serving: c.PKI.KubeletServing,
	}
	c.nodes = []*kubeletNode{first}
	for _, o := range c.Nodes {
		n := &kubeletNode{
			name: o.Name, ip: o.IP, criSocket: o.CRISocket,
			rootDir: filepath.Join(o.Dir, "kubelet"), certDir: filepath.Join(o.Dir, "kubelet-pki"),
			podLogsDir: filepath.Join(o.Dir, "pod-logs"), cgroupRoot: o.CgroupRoot,
			configPath: filepath.Join(o.Dir, "kubelet.json"), kubeconfig: filepath.Join(o.Dir, "kubelet.kubeconfig"),
			labels: o.Labels, port: o.KubeletPort, healthzPort: o.KubeletHealthzPort,
		}
		var err error
		if n.client, n.serving, err = c.PKI.issueNode("kubelet-"+o.Name, o.Name, o.IP); err != nil {
			return err
		}
		c.nodes = append(c.nodes, n)
	}
	for _, n := range c.nodes {
		if err := mkdirs(n.rootDir, n.podLogsDir); err != nil {
			return err
		}
	}
	return nil
}

// checkNodes refuses further nodes that would share a name, an address,
// a port, a socket or a cgroup root with another node.
func (o *Options) checkNodes() error {
	names := map[string]bool{o.Node: true}
	ips := map[string]bool{o.NodeIP.String(): true}
	roots := map[string]bool{CgroupRoot: true}
	sockets := map[string]bool{o.CRISocket: true}
	ports := map[int]bool{o.Ports.Kubelet: true, o.Ports.KubeletHealthz: true}
	for _, n := range o.Nodes {
		switch {
		case n.Name == "" || n.IP.To4() == nil || n.CRISocket == "" || !filepath.IsAbs(n.Dir) || !filepath.IsAbs(n.CgroupRoot) ||
			n.KubeletPort == 0 || n.KubeletHealthzPort == 0:
			return fmt.Errorf("kube: node %q: Name, IP (IPv4), CRISocket, Dir and CgroupRoot (absolute) and the ports are required", n.Name)
		case names[n.Name] || ips[n.IP.String()] || roots[n.CgroupRoot] || sockets[n.CRISocket] || ports[n.KubeletPort] ||
			ports[n.KubeletHealthzPort] || n.KubeletPort == n.KubeletHealthzPort:
			return fmt.Errorf("kube: node %q shares its name, IP, cgroup root, CRI socket or a port with another node", n.Name)
		}
		names[n.Name], ips[n.IP.String()], roots[n.CgroupRoot], sockets[n.CRISocket] = true, true, true, true
		ports[n.KubeletPort], ports[n.KubeletHealthzPort] = true, true
	}
	return nil
}

func (c *Cluster) kubeletProcess(n *kubeletNode) *process {
	argv := []string{c.bin("kubelet"),
		"--config=" + n.configPath,
		"--kubeconfig=" + n.kubeconfig,
		"--hostname-override=" + n.name,
		"--node-ip=" + n.ip.String(),
		"--root-dir=" + n.rootDir,
		"--cert-dir=" + n.certDir,
		"--v=2"}
	if len(n.labels) > 0 {
		var kv []string
		for k, v := range n.labels {
			kv = append(kv, k+"="+v)
		}
		sort.Strings(kv)
		argv = append(argv, "--node-labels="+strings.Join(kv, ","))
	}
	return c.newProcess(c.component(n), argv...)
}

// devicePluginSocket is where every kubelet listens for device plugins,
// whatever its --root-dir (pkg/kubelet/cm/devicemanager): at start a
// kubelet empties the directory, then binds the socket. A kubelet that
// empties it while another binds fails to bind ("address already in
// use") and exits.
const devicePluginSocket = "/var/lib/kubelet/device-plugins/kubelet.sock"

// startKubelets starts every node's kubelet and waits until every node is
// Ready: the nodes register in parallel. Each kubelet after the first
// starts once the one before has bound the device-plugin socket, a few
// seconds into its start.
func (c *Cluster) startKubelets(ctx context.Context) error {
	var ps []*process
	for i, n := range c.nodes {
		before, _ := os.Stat(devicePluginSocket)
		n.proc = c.kubeletProcess(n)
		if err := n.proc.start(); err != nil {
			return err
		}
		ps = append(ps, n.proc)
		if i == len(c.nodes)-1 {
			break
		}
		if err := c.waitFor(ctx, n.proc, func(context.Context) error { return socketReplaced(devicePluginSocket, before) }, ps...); err != nil {
			return err
		}
	}
	c.kubelet = c.nodes[0].proc
	var errs []error
	for _, n := range c.nodes {
		errs = append(errs, c.waitFor(ctx, n.proc, c.nodeReady(n.name), ps...))
	}
	return errors.Join(errs...)
}

// socketReplaced checks that path exists and is not the file before was
// (a new file may reuse the old one's inode, not its modification time).
func socketReplaced(path string, before os.FileInfo) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if before != nil && os.SameFile(fi, before) && fi.ModTime().Equal(before.ModTime()) {
		return fmt.Errorf("%s not bound again yet", path)
	}
	return nil
}

// NodeKubeletDir is the kubelet root dir of a node of the cluster, ""
// for a name the cluster does not have.
func (c *Cluster) NodeKubeletDir(name string) string {
	for _, n := range c.nodes {
		if n.name == name {
			return n.rootDir
		}
	}
	return ""
}
