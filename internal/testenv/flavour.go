package testenv

import (
	"fmt"
	"sort"
	"strings"
	"text/template"
)

// Flavour is one containerd release line the shim supports.
type Flavour struct {
	Name       string // "1.6" or "2.x"
	Containerd string // the daemon binary
	Ctr        string // ctr of the same release

	config *template.Template
}

var flavours = map[string]Flavour{
	"1.6": {
		Name: "1.6", Containerd: "/usr/bin/containerd", Ctr: "/usr/bin/ctr",
		config: configV2Template,
	},
	"2.x": {
		Name:       "2.x",
		Containerd: "/usr/local/lib/kvm-shim/containerd-v2.2.1/bin/containerd",
		Ctr:        "/usr/local/lib/kvm-shim/containerd-v2.2.1/bin/ctr",
		config:     configV3Template,
	},
}

// LookupFlavour returns the flavour called name ("1.6" or "2.x").
func LookupFlavour(name string) (Flavour, error) {
	f, ok := flavours[name]
	if !ok {
		return Flavour{}, fmt.Errorf("unknown containerd flavour %q (known: %s)", name, strings.Join(FlavourNames(), ", "))
	}
	return f, nil
}

// FlavourNames lists the known flavours in order.
func FlavourNames() []string {
	names := make([]string, 0, len(flavours))
	for n := range flavours {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Both configs set restrict_oom_score_adj: this kernel refuses negative
// oom_score_adj values, and CRI gives sandboxes -998, which made runc fail
// with "can't get final child's PID from pipe: EOF". Both declare the runc
// runtime: containerd 1.6's CRI refuses to load when a config declares
// runtimes.kvm without the default runtime.

// configV2 is the config of containerd 1.6 (config version 2).
const configV2 = `version = 2
root = {{q .Root}}
state = {{q .State}}

[grpc]
  address = {{q .Address}}

[ttrpc]
  address = {{q .TTRPCAddress}}

[debug]
  level = {{q .LogLevel}}

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = {{q .Opt}}

  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = {{q .SandboxImage}}
    restrict_oom_score_adj = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"

    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = {{q .CNIBinDir}}
      conf_dir = {{q .CNIConfDir}}
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
          ConfigPath = {{q .ShimConfigPath}}
`

// configV3 is the config of containerd 2.x (config version 3), where CRI is
// split into io.containerd.cri.v1.images and io.containerd.cri.v1.runtime.
const configV3 = `version = 3
root = {{q .Root}}
state = {{q .State}}
imports = []

[grpc]
  address = {{q .Address}}

[ttrpc]
  address = {{q .TTRPCAddress}}

[debug]
  level = {{q .LogLevel}}

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = {{q .Opt}}

  [plugins."io.containerd.nri.v1.nri"]
    disable = true

  [plugins."io.containerd.grpc.v1.cri"]
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"

  [plugins."io.containerd.cri.v1.images"]
    [plugins."io.containerd.cri.v1.images".pinned_images]
      sandbox = {{q .SandboxImage}}

  [plugins."io.containerd.cri.v1.runtime"]
    netns_mounts_under_state_dir = true
    restrict_oom_score_adj = true

    [plugins."io.containerd.cri.v1.runtime".cni]
      bin_dirs = [{{q .CNIBinDir}}]
      conf_dir = {{q .CNIConfDir}}
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
          ConfigPath = {{q .ShimConfigPath}}
`

// cniConfList is the private pod network: a bridge on this machine only,
// addresses from host-local.
const cniConfList = `{
  "cniVersion": "1.0.0",
  "name": {{q .CNINetwork}},
  "plugins": [
    {
      "type": "bridge",
      "bridge": {{q .Bridge}},
      "isGateway": true,
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "dataDir": {{q .IPAMDir}},
        "ranges": [[{"subnet": {{q .Subnet}}}]]
      }
    },
    {"type": "loopback"}
  ]
}
`

// shimConfigHead is written before Options.ShimConfig: the state_dir belongs
// to the daemon's directory so that leftovers can be told apart.
const shimConfigHead = `# written by internal/testenv
libvirt_uri = "qemu:///system"
state_dir = {{q .ShimStateDir}}
`

// funcs quote strings for TOML and JSON alike: both accept Go's %q for the
// paths and names used here (printable ASCII).
var funcs = template.FuncMap{"q": func(s string) string { return fmt.Sprintf("%q", s) }}

var (
	cniTemplate      = template.Must(template.New("cni").Funcs(funcs).Parse(cniConfList))
	shimHeadTemplate = template.Must(template.New("shim").Funcs(funcs).Parse(shimConfigHead))
	configV2Template = template.Must(template.New("1.6").Funcs(funcs).Parse(configV2))
	configV3Template = template.Must(template.New("2.x").Funcs(funcs).Parse(configV3))
)
