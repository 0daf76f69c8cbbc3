package testenv

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
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
			dir := t.TempDir()
			c := &Containerd{
				Flavour: f, Dir: dir, Root: dir + "/root", State: dir + "/state", Opt: dir + "/opt",
				Address: dir + "/c.sock", TTRPCAddress: dir + "/c.sock.ttrpc", ConfigPath: dir + "/config.toml",
				ShimConfigPath: dir + "/kvm-shim.toml", ShimStateDir: dir + "/shim-state",
				SandboxImage: "localhost/pause:1", CNIBinDir: DefaultCNIBinDir, CNIConfDir: dir,
				CNINetwork: "testenv-br0", IPAMDir: dir + "/ipam", Bridge: "br0", Subnet: "10.1.2.0/24", LogLevel: "info",
			}
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
			var cni map[string]any
			b, _ = os.ReadFile(filepath.Join(dir, "10-testenv.conflist"))
			if err := json.Unmarshal(b, &cni); err != nil {
				t.Fatalf("CNI config is not JSON: %v\n%s", err, b)
			}
		})
	}
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

func TestUnescapeMountinfo(t *testing.T) {
	if got := unescapeMountinfo(`/run/a\040b`); got != "/run/a b" {
		t.Errorf("got %q", got)
	}
}
