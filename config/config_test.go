package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(body string) string {
		p := dir + "/c.toml"
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfg, err := Load(write("accel = \"tcg\"\nstate_dir = \"/srv/kvm\"\ndefault_memory_mib = 256\n"))
	if err != nil || cfg.Accel != "tcg" || cfg.StateDir != "/srv/kvm" || cfg.DefaultMemoryMiB != 256 || cfg.Machine != "q35" {
		t.Fatalf("got %+v, %v", cfg, err)
	}
	for body, want := range map[string]string{
		"acel = \"tcg\"\n":           "acel",
		"accel = \"hvf\"\n":          "hvf",
		"state_dir = \"relative\"\n": "state_dir",
		"default_vcpus = 0\n":        "default_vcpus",
		"accel = \n":                 "c.toml",
	} {
		if _, err := Load(write(body)); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: want InvalidArgument naming %q, got %v", body, want, err)
		}
	}
	if _, err := Load(dir + "/missing.toml"); err == nil {
		t.Error("a missing explicit config was accepted")
	}
}

// The shipped example must parse and document exactly the defaults.
func TestExampleConfigIsDefaults(t *testing.T) {
	cfg, err := Load("../config.example.toml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg != Default() {
		t.Errorf("config.example.toml differs from Default():\n%+v\n%+v", cfg, Default())
	}
}

func TestConfigVMIDRange(t *testing.T) {
	for in, want := range map[string]string{
		"1000-2000":         "starts below 65536",
		"2000000-1000000":   "last id is below the first",
		"100000":            "want FIRST-LAST",
		"100000-4294967295": "invalid id -1",
		"100000-100000":     "",
		"":                  "",
	} {
		p := filepath.Join(t.TempDir(), "c.toml")
		if err := os.WriteFile(p, []byte("vm_id_range = \""+in+"\"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := Load(p)
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(),
			"vm_id_range") || !strings.Contains(err.Error(), want)) {
			t.Errorf("vm_id_range = %q: %v, want %q", in, err, want)
		}
	}
}
