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
	// RuncShim is the containerd-shim-runc-v2 of the same release. A
	// link to it comes first in the daemon's PATH after the caller's
	// PathPrefix, so each daemon runs its own release's runc shim.
	RuncShim string

	// configVersion is the version of the daemon's config: 2 for 1.6, 3
	// for 2.x. It selects the layout of the one config template.
	configVersion int
}

var flavours = map[string]Flavour{
	"1.6": {
		Name: "1.6", Containerd: "/usr/bin/containerd", Ctr: "/usr/bin/ctr",
		RuncShim:      "/usr/bin/containerd-shim-runc-v2",
		configVersion: 2,
	},
	"2.x": {
		Name:          "2.x",
		Containerd:    "/usr/local/lib/kvm-shim/containerd-v2.2.1/bin/containerd",
		Ctr:           "/usr/local/lib/kvm-shim/containerd-v2.2.1/bin/ctr",
		RuncShim:      "/usr/local/lib/kvm-shim/containerd-v2.2.1/bin/containerd-shim-runc-v2",
		configVersion: 3,
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

// The config sets restrict_oom_score_adj: this kernel refuses negative
// oom_score_adj values, and CRI gives sandboxes -998, which made runc fail
// with "can't get final child's PID from pipe: EOF". It declares the runc
// runtime: containerd 1.6's CRI refuses to load when a config declares
// runtimes.kvm without the default runtime. It sets
// disable_hugetlb_controller = false: containerd's default (true) drops a
// container's huge page limits from the OCI spec without a word, so the
// shim would never see that a pod asked for huge pages (with false, CRI
// passes them when the hugetlb cgroup controller is mounted, and drops them
// with a warning when it is not).

// config is the daemon's config, rendered with configData. Version 2
// (containerd 1.6) keeps all of CRI in io.containerd.grpc.v1.cri; version 3
// (containerd 2.x) splits it into io.containerd.cri.v1.images (the sandbox
// image) and io.containerd.cri.v1.runtime (cni and runtimes), leaving only
// the streaming server in io.containerd.grpc.v1.cri.
const config = `version = {{.ConfigVersion}}
root = {{q .Root}}
state = {{q .State}}
{{- if eq .ConfigVersion 3}}
imports = [{{range $i, $p := .Imports}}{{if $i}}, {{end}}{{q $p}}{{end}}]
{{- end}}

[grpc]
  address = {{q .Address}}

[ttrpc]
  address = {{q .TTRPCAddress}}

[debug]
  address = {{q .DebugAddress}}
  level = {{q .LogLevel}}

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = {{q .Opt}}
{{- if eq .ConfigVersion 3}}

  [plugins."io.containerd.nri.v1.nri"]
    disable = true
{{- end}}

  [plugins."io.containerd.grpc.v1.cri"]
{{- if eq .ConfigVersion 2}}
    sandbox_image = {{q .SandboxImage}}
    restrict_oom_score_adj = true
    disable_hugetlb_controller = false
{{- end}}
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
{{- if eq .ConfigVersion 3}}

  [plugins."io.containerd.cri.v1.images"]
    [plugins."io.containerd.cri.v1.images".pinned_images]
      sandbox = {{q .SandboxImage}}

  [plugins."io.containerd.cri.v1.runtime"]
    netns_mounts_under_state_dir = true
    restrict_oom_score_adj = true
    disable_hugetlb_controller = false
{{- end}}

    [{{.CRIRuntime}}.cni]
{{- if eq .ConfigVersion 2}}
      bin_dir = {{q .CNIBinDir}}
{{- else}}
      bin_dirs = [{{q .CNIBinDir}}]
{{- end}}
      conf_dir = {{q .CNIConfDir}}
      max_conf_num = 1

    [{{.CRIRuntime}}.containerd]
      default_runtime_name = "runc"

      [{{.CRIRuntime}}.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
{{- if not .NoKVMRuntime}}

      [{{.CRIRuntime}}.containerd.runtimes.kvm]
        runtime_type = "io.containerd.kvm.v1"
        pod_annotations = ["kvm.containerd.io/*"]
        container_annotations = ["kvm.containerd.io/*"]

        [{{.CRIRuntime}}.containerd.runtimes.kvm.options]
          ConfigPath = {{q .ShimConfigPath}}

      [{{.CRIRuntime}}.containerd.runtimes.kvm-plain]
        runtime_type = "io.containerd.kvm.v1"
        pod_annotations = ["kvm.containerd.io/*"]
        container_annotations = ["kvm.containerd.io/*"]

        [{{.CRIRuntime}}.containerd.runtimes.kvm-plain.options]
          ConfigPath = {{q .ShimPlainConfigPath}}
{{- end}}
{{- if .RegistryConfig}}

  [{{.CRIImages}}.registry]
    config_path = {{q .RegistryConfig}}
{{- end}}
`

// configData is what the config template sees: the daemon, and its
// flavour's config version and the plugins of CRI's cni and runtimes and
// of its image service.
type configData struct {
	*Containerd
	ConfigVersion int
	CRIRuntime    string
	CRIImages     string
}

func (c *Containerd) configData() configData {
	d := configData{Containerd: c, ConfigVersion: c.Flavour.configVersion}
	if d.ConfigVersion == 2 {
		d.CRIRuntime = `plugins."io.containerd.grpc.v1.cri"`
		d.CRIImages = d.CRIRuntime
	} else {
		d.CRIRuntime = `plugins."io.containerd.cri.v1.runtime"`
		d.CRIImages = `plugins."io.containerd.cri.v1.images"`
	}
	return d
}

// cniConfList is the private pod network: a bridge on this machine only,
// addresses from host-local; the bridge is the pods' default gateway with
// Options.DefaultGateway, and portmap gives pods their host ports with
// Options.PortMap.
const cniConfList = `{
  "cniVersion": "1.0.0",
  "name": {{q .CNINetwork}},
  "plugins": [
    {
      "type": "bridge",
      "bridge": {{q .Bridge}},
      "isGateway": true,
{{- if .DefaultGateway}}
      "isDefaultGateway": true,
{{- end}}
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "dataDir": {{q .IPAMDir}},
        "ranges": [[{"subnet": {{q .Subnet}}}]]
      }
    },
{{- if .PortMap}}
    {"type": "portmap", "capabilities": {"portMappings": true}},
{{- end}}
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
	configTemplate   = template.Must(template.New("config").Funcs(funcs).Parse(config))
)
