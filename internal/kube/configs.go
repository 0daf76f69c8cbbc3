package kube

import (
	"encoding/json"
	"fmt"
	"os"
)

// The components read their config files as YAML, of which JSON is a
// subset: every file here is written with encoding/json from Go values.

// kubeconfig is the subset of a kubeconfig file written here: one cluster,
// one user with a client certificate, one context.
type kubeconfig struct {
	APIVersion     string         `json:"apiVersion"`
	Kind           string         `json:"kind"`
	Clusters       []namedCluster `json:"clusters"`
	Users          []namedUser    `json:"users"`
	Contexts       []namedContext `json:"contexts"`
	CurrentContext string         `json:"current-context"`
	Preferences    struct{}       `json:"preferences"`
}

type namedCluster struct {
	Name    string `json:"name"`
	Cluster struct {
		Server               string `json:"server"`
		CertificateAuthority string `json:"certificate-authority"`
	} `json:"cluster"`
}

type namedUser struct {
	Name string `json:"name"`
	User struct {
		ClientCertificate string `json:"client-certificate"`
		ClientKey         string `json:"client-key"`
	} `json:"user"`
}

type namedContext struct {
	Name    string `json:"name"`
	Context struct {
		Cluster string `json:"cluster"`
		User    string `json:"user"`
	} `json:"context"`
}

// writeKubeconfig writes a kubeconfig for server, trusting caFile, as the
// user of client.
func writeKubeconfig(path, server, caFile string, client pair) error {
	k := kubeconfig{APIVersion: "v1", Kind: "Config", CurrentContext: "e2e"}
	var c namedCluster
	c.Name, c.Cluster.Server, c.Cluster.CertificateAuthority = "e2e", server, caFile
	var u namedUser
	u.Name, u.User.ClientCertificate, u.User.ClientKey = "e2e", client.Cert, client.Key
	var x namedContext
	x.Name, x.Context.Cluster, x.Context.User = "e2e", "e2e", "e2e"
	k.Clusters, k.Users, k.Contexts = []namedCluster{c}, []namedUser{u}, []namedContext{x}
	return writeJSON(path, k)
}

// kubeletConfig is kubelet's KubeletConfiguration for node n.
func (c *Cluster) kubeletConfig(n *kubeletNode) map[string]any {
	return map[string]any{
		"apiVersion": "kubelet.config.k8s.io/v1beta1",
		"kind":       "KubeletConfiguration",
		"address":    n.ip.String(),
		"port":       n.port,
		// No unauthenticated read-only port.
		"readOnlyPort":       0,
		"healthzBindAddress": "127.0.0.1",
		"healthzPort":        n.healthzPort,
		"tlsCertFile":        n.serving.Cert,
		"tlsPrivateKeyFile":  n.serving.Key,
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": false},
			"x509":      map[string]any{"clientCAFile": c.PKI.CA},
		},
		// Only holders of a certificate of the cluster's CA get in (the
		// apiserver and the admin): each may do everything.
		"authorization": map[string]any{"mode": "AlwaysAllow"},
		// This machine: cgroup v1 (deprecated by kubelet, still
		// supported when asked for), no systemd, no swap accounting.
		"cgroupDriver":             "cgroupfs",
		"cgroupRoot":               n.cgroupRoot,
		"failCgroupV1":             false,
		"failSwapOn":               false,
		"containerRuntimeEndpoint": "unix://" + n.criSocket,
		"podLogsDir":               n.podLogsDir,
		"staticPodPath":            "",
		"resolvConf":               "/etc/resolv.conf",
		// A shared test host: kubelet must not evict pods or delete
		// images because other people's work fills the disk.
		"evictionHard":                  map[string]string{"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
		"imageGCHighThresholdPercent":   100,
		"imageGCLowThresholdPercent":    99,
		"serializeImagePulls":           false,
		"nodeStatusReportFrequency":     "10s",
		"syncFrequency":                 "10s",
		"fileCheckFrequency":            "10s",
		"shutdownGracePeriod":           "0s",
		"localStorageCapacityIsolation": true,
		"enableServer":                  true,
	}
}

// kubeProxyConfig is kube-proxy's KubeProxyConfiguration: iptables mode,
// node ports only on the node IP (no route_localnet), no conntrack sysctl
// changes on the shared host.
func (c *Cluster) kubeProxyConfig() map[string]any {
	return map[string]any{
		"apiVersion":         "kubeproxy.config.k8s.io/v1alpha1",
		"kind":               "KubeProxyConfiguration",
		"mode":               "iptables",
		"bindAddress":        "127.0.0.1",
		"healthzBindAddress": fmt.Sprintf("127.0.0.1:%d", c.Ports.ProxyHealthz),
		"metricsBindAddress": fmt.Sprintf("127.0.0.1:%d", c.Ports.ProxyMetrics),
		"clusterCIDR":        c.PodCIDR,
		"hostnameOverride":   c.Node,
		"nodePortAddresses":  []string{c.NodeIP.String() + "/32"},
		"clientConnection":   map[string]any{"kubeconfig": c.kubeconfigPath("kube-proxy")},
		"conntrack": map[string]any{
			"maxPerCore":            0,
			"min":                   0,
			"tcpEstablishedTimeout": "0s",
			"tcpCloseWaitTimeout":   "0s",
		},
	}
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o600)
}
