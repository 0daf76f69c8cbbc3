package testenv

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
)

func TestConfigsRender(t *testing.T) {
	for _, name := range FlavourNames() {
		t.Run(name, func(t *testing.T) {
			f, err := LookupFlavour(name)
			if err != nil {
				t.Fatal(err)
			}
			c := newContainerd(f, Options{Dir: t.TempDir(), SandboxImage: "localhost/pause:1", Bridge: "br0", Subnet: "10.1.2.0/24"})
			if err := c.writeConfigs("accel = \"tcg\"\ndefault_memory_mib = 128\n"); err != nil {
				t.Fatal(err)
			}
			var cfg map[string]any
			b, _ := os.ReadFile(c.ConfigPath)
			if err := toml.Unmarshal(b, &cfg); err != nil {
				t.Fatalf("containerd config is not TOML: %v\n%s", err, b)
			}
			if !strings.Contains(string(b), `ConfigPath = "`+c.ShimConfigPath+`"`) {
				t.Errorf("config does not point the kvm runtime at the shim config:\n%s", b)
			}
			var shim map[string]any
			b, _ = os.ReadFile(c.ShimConfigPath)
			if err := toml.Unmarshal(b, &shim); err != nil {
				t.Fatalf("shim config is not TOML: %v\n%s", err, b)
			}
			if shim["state_dir"] != c.ShimStateDir || shim["accel"] != "tcg" {
				t.Errorf("shim config = %v", shim)
			}
			if cni := readCNI(t, c); cni.Name != "testenv-br0" || cni.Plugins[0].IsDefaultGateway {
				t.Errorf("CNI config with default options: name %q, isDefaultGateway %v", cni.Name, cni.Plugins[0].IsDefaultGateway)
			}
		})
	}
}

func TestCNIOptions(t *testing.T) {
	f, _ := LookupFlavour("1.6")
	c := newContainerd(f, Options{Dir: t.TempDir(), SandboxImage: "localhost/pause:1", Bridge: "br0", Subnet: "10.1.2.0/24",
		CNINetwork: "net0", DefaultGateway: true})
	if err := c.writeConfigs(""); err != nil {
		t.Fatal(err)
	}
	if cni := readCNI(t, c); cni.Name != "net0" || !cni.Plugins[0].IsDefaultGateway {
		t.Errorf("CNI config: name %q, isDefaultGateway %v; want net0, true", cni.Name, cni.Plugins[0].IsDefaultGateway)
	}
}

// TestRegistryAndPortMap: the registry's config_path lands in the table
// of CRI's image service of each config version, and portmap follows the
// bridge in the CNI chain.
func TestRegistryAndPortMap(t *testing.T) {
	for name, table := range map[string]string{
		"1.6": "io.containerd.grpc.v1.cri",
		"2.x": "io.containerd.cri.v1.images",
	} {
		f, _ := LookupFlavour(name)
		c := newContainerd(f, Options{Dir: t.TempDir(), SandboxImage: "localhost/pause:1", Bridge: "br0", Subnet: "10.1.2.0/24",
			RegistryConfigPath: "/x/certs.d", PortMap: true})
		if err := c.writeConfigs(""); err != nil {
			t.Fatal(err)
		}
		var cfg struct {
			Plugins map[string]struct {
				Registry struct {
					ConfigPath string `toml:"config_path"`
				} `toml:"registry"`
			} `toml:"plugins"`
		}
		b, _ := os.ReadFile(c.ConfigPath)
		if err := toml.Unmarshal(b, &cfg); err != nil {
			t.Fatalf("%s: containerd config is not TOML: %v\n%s", name, err, b)
		}
		if got := cfg.Plugins[table].Registry.ConfigPath; got != "/x/certs.d" {
			t.Errorf("%s: %s registry config_path = %q; want /x/certs.d\n%s", name, table, got, b)
		}
		var cni cniConf
		b, _ = os.ReadFile(filepath.Join(c.CNIConfDir, "10-testenv.conflist"))
		if err := json.Unmarshal(b, &cni); err != nil {
			t.Fatalf("CNI config is not JSON: %v\n%s", err, b)
		}
		if len(cni.Plugins) != 3 || cni.Plugins[1].Type != "portmap" {
			t.Errorf("%s: CNI chain with PortMap: want bridge, portmap, loopback:\n%s", name, b)
		}
	}
	f, _ := LookupFlavour("2.x")
	c := newContainerd(f, Options{Dir: t.TempDir(), SandboxImage: "localhost/pause:1", Bridge: "br0", Subnet: "10.1.2.0/24"})
	if err := c.writeConfigs(""); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(c.ConfigPath); strings.Contains(string(b), "config_path") {
		t.Errorf("config_path written without RegistryConfigPath:\n%s", b)
	}
}

type cniConf struct {
	Name    string
	Plugins []struct {
		Type             string
		IsDefaultGateway bool
	}
}

func readCNI(t *testing.T, c *Containerd) cniConf {
	t.Helper()
	var cni cniConf
	b, _ := os.ReadFile(filepath.Join(c.CNIConfDir, "10-testenv.conflist"))
	if err := json.Unmarshal(b, &cni); err != nil {
		t.Fatalf("CNI config is not JSON: %v\n%s", err, b)
	}
	if len(cni.Plugins) != 2 || cni.Plugins[0].Type != "bridge" {
		t.Fatalf("CNI config: want bridge and loopback:\n%s", b)
	}
	return cni
}

func TestIsShimOf(t *testing.T) {
	const addr = "/run/x/containerd.sock"
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"/usr/bin/containerd-shim-runc-v2", "-namespace", "k8s.io", "-id", "a", "-address", addr}, true},
		{[]string{"/bin/containerd-shim-kvm-v1", "-address=" + addr}, true},
		{[]string{"/bin/containerd-shim-kvm-v1", "--address", addr + "2"}, false},
		{[]string{"/usr/bin/containerd", "-address", addr}, false},
		{nil, false},
	} {
		if got := isShimOf(tc.args, addr); got != tc.want {
			t.Errorf("isShimOf(%q) = %v, want %v", tc.args, got, tc.want)
		}
	}
}

func TestArchiveImageName(t *testing.T) {
	write := func(name, body string) string {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		_ = tw.WriteHeader(&tar.Header{Name: "oci-layout", Mode: 0o644, Size: 2})
		_, _ = tw.Write([]byte("{}"))
		_ = tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body))})
		_, _ = tw.Write([]byte(body))
		_ = tw.Close()
		p := filepath.Join(t.TempDir(), "a.tar")
		if err := os.WriteFile(p, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	oci := write("index.json", `{"manifests":[{"annotations":{"io.containerd.image.name":"localhost/a:1"}}]}`)
	if got, err := ArchiveImageName(oci); err != nil || got != "localhost/a:1" {
		t.Errorf("OCI archive: %q, %v", got, err)
	}
	docker := write("manifest.json", `[{"RepoTags":["localhost/b:2"]}]`)
	if got, err := ArchiveImageName(docker); err != nil || got != "localhost/b:2" {
		t.Errorf("docker archive: %q, %v", got, err)
	}
	if _, err := ArchiveImageName(write("index.json", `{"manifests":[]}`)); err == nil {
		t.Error("an index without manifests must be an error")
	}
}

func TestServerVersion(t *testing.T) {
	out := "Client:\n  Version:  1.6.20~ds1\n  Revision: x\n\nServer:\n  Version:  v2.2.1\n  Revision: y\n  UUID: z\n"
	if v, err := serverVersion(out); err != nil || v != "v2.2.1" {
		t.Errorf("serverVersion = %q, %v", v, err)
	}
	if _, err := serverVersion("Client:\n  Version: 1\n"); err == nil {
		t.Error("no Server section must be an error")
	}
}

func TestStateDirLeftovers(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"vms", "pods"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if got := StateDirLeftovers(dir); len(got) != 0 {
		t.Errorf("empty top-level directories: %v", got)
	}
	if got := StateDirLeftovers(filepath.Join(dir, "missing")); len(got) != 0 {
		t.Errorf("missing state_dir: %v", got)
	}
	_ = os.Mkdir(filepath.Join(dir, "vms", "kvm-a"), 0o755)
	_ = os.WriteFile(filepath.Join(dir, "stray"), nil, 0o644)
	want := []string{"shim state " + filepath.Join(dir, "stray"), "shim state " + filepath.Join(dir, "vms", "kvm-a")}
	got := StateDirLeftovers(dir)
	sort.Strings(got)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestLeftoverDomain(t *testing.T) {
	if d, ok := LeftoverDomain(leftoverDomain + "kvm-a"); !ok || d != "kvm-a" {
		t.Errorf("got %q, %v", d, ok)
	}
	if _, ok := LeftoverDomain("mount /x"); ok {
		t.Error("a mount is not a domain")
	}
}

func TestRuncShimDirHoldsOnlyTheLink(t *testing.T) {
	daemon := t.TempDir()
	shim := filepath.Join(t.TempDir(), "containerd-shim-runc-v2")
	if err := os.WriteFile(shim, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for range 2 { // a restarted daemon reuses its dir
		dir, err := runcShimDir(daemon, shim)
		if err != nil {
			t.Fatal(err)
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 1 || entries[0].Name() != "containerd-shim-runc-v2" {
			t.Fatalf("%s holds %v, want only containerd-shim-runc-v2", dir, entries)
		}
		if got, err := os.Readlink(filepath.Join(dir, "containerd-shim-runc-v2")); err != nil || got != shim {
			t.Fatalf("link = %q, %v; want %q", got, err, shim)
		}
	}
	if _, err := runcShimDir(daemon, filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("a missing runc shim was accepted")
	}
}

func TestParseGoroutineTotal(t *testing.T) {
	if n, err := parseGoroutineTotal("goroutine profile: total 123\n"); n != 123 || err != nil {
		t.Errorf("parseGoroutineTotal = %d, %v; want 123", n, err)
	}
	if _, err := parseGoroutineTotal("<html>404 page not found\n"); err == nil {
		t.Error("parseGoroutineTotal accepted a page that is not a goroutine profile")
	}
}

func TestConfigHasDebugAddress(t *testing.T) {
	for _, name := range FlavourNames() {
		f, _ := LookupFlavour(name)
		c := newContainerd(f, Options{Dir: t.TempDir(), SandboxImage: "localhost/pause:1", Bridge: "br0", Subnet: "10.1.2.0/24"})
		if err := c.writeConfigs(""); err != nil {
			t.Fatal(err)
		}
		var cfg struct {
			Debug struct {
				Address string `toml:"address"`
			} `toml:"debug"`
		}
		b, _ := os.ReadFile(c.ConfigPath)
		if err := toml.Unmarshal(b, &cfg); err != nil || cfg.Debug.Address != c.DebugAddress {
			t.Errorf("%s: debug address %q (%v), want %q", name, cfg.Debug.Address, err, c.DebugAddress)
		}
	}
}
