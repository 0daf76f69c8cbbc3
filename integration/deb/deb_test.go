//go:build deb

// Package deb tests the Debian package (`make deb`) on this host as an
// operator uses it: lintian, install, upgrade to a later build, remove and
// purge with dpkg, with Debian's containerd 1.6 and with containerd 2.x.
//
// The tests carry the build tag deb (`make deb-test`, run by `make test`).
// They need root and a host where the package is not installed; they
// install it for real (/usr/bin, /etc) and purge it again.
package deb

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

const (
	pkg       = "containerd-shim-kvm-v1"
	dropIn    = "/etc/containerd/conf.d/" + pkg + ".toml"
	conffile  = "/etc/" + pkg + "/config.toml"
	ctrdConf  = "/etc/containerd/config.toml"
	stateDir  = "/var/lib/" + pkg
	wrapper   = "/usr/libexec/" + pkg + "/kvm-qemu-wrapper"
	shimPath  = "/usr/bin/" + pkg
	operators = "# a line the operator added"
)

var repo = func() string {
	r, err := filepath.Abs("../..")
	if err != nil {
		panic(err)
	}
	return r
}()

// run runs a command and returns its combined output; env entries are
// added to the test's own environment.
func run(t *testing.T, env []string, name string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func mustRun(t *testing.T, env []string, name string, args ...string) string {
	t.Helper()
	out, err := run(t, env, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

func build(t *testing.T, out, version string) string {
	t.Helper()
	deb := strings.TrimSpace(mustRun(t, []string{"DEB_OUT=" + out, "DEB_VERSION=" + version},
		filepath.Join(repo, "deploy/deb/build.sh")))
	if _, err := os.Stat(deb); err != nil {
		t.Fatalf("build.sh printed %q: %v", deb, err)
	}
	return deb
}

func installedVersion(t *testing.T) string {
	out, err := run(t, nil, "dpkg-query", "-W", "-f=${Status} ${Version}", pkg)
	if err != nil {
		return ""
	}
	f := strings.Fields(out)
	if len(f) < 4 || f[2] != "installed" {
		return ""
	}
	return f[3]
}

func wantContains(t *testing.T, what, text string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(text, w) {
			t.Errorf("%s does not say %q:\n%s", what, w, text)
		}
	}
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// configDump is containerd's merged view of config (containerd config dump).
func configDump(t *testing.T, containerd, config string) string {
	t.Helper()
	return mustRun(t, nil, containerd, "--config", config, "config", "dump")
}

// TestDebianPackage builds two versions of the package and takes the first
// through install, an upgrade to the second, remove and purge, checking
// what the maintainer scripts say and do at each step, that the runtime
// configuration they give works with real containerd 1.6 and 2.x, that an
// operator's change to the config survives the upgrade, and that no step
// touches containerd's config.toml or a VM's data.
func TestDebianPackage(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the package test installs with dpkg: it needs root")
	}
	for _, tool := range []string{"dpkg", "dpkg-deb", "lintian"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed (hack/setup-host.sh installs it)", tool)
		}
	}
	if v := installedVersion(t); v != "" {
		t.Fatalf("%s %s is installed on this host; the test installs and purges it, so it will not run here", pkg, v)
	}
	if exists(dropIn) {
		t.Fatalf("%s exists already; the test would remove it", dropIn)
	}
	t.Cleanup(func() {
		if installedVersion(t) != "" || exists(conffile) {
			out, err := run(t, nil, "dpkg", "--purge", pkg)
			t.Logf("cleanup: dpkg --purge: %v\n%s", err, out)
		}
	})
	// A config an earlier `make install` left would make dpkg ask about its
	// conffile; the test installs as on a fresh machine and puts it back.
	if exists(filepath.Dir(conffile)) {
		aside := filepath.Join(t.TempDir(), "etc")
		if err := os.Rename(filepath.Dir(conffile), aside); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = os.RemoveAll(filepath.Dir(conffile))
			if err := os.Rename(aside, filepath.Dir(conffile)); err != nil {
				t.Errorf("put back %s: %v", filepath.Dir(conffile), err)
			}
		})
	}
	ctrdConfBefore, err := os.ReadFile(ctrdConf)
	if err != nil {
		t.Fatalf("Debian's containerd config: %v", err)
	}
	c2, err := testenv.LookupFlavour("2.x")
	if err != nil {
		t.Fatal(err)
	}

	out := t.TempDir()
	deb1 := build(t, out, "0.0.0+debtest1")
	deb2 := build(t, out, "0.0.0+debtest2")
	lint, err := run(t, nil, "lintian", deb1)
	t.Logf("lintian %s:\n%s", filepath.Base(deb1), lint)
	for _, line := range strings.Split(lint, "\n") {
		if strings.HasPrefix(line, "E: ") {
			t.Errorf("lintian reports an error: %s", line)
		}
	}
	if err != nil && !strings.Contains(lint, "W: ") {
		t.Errorf("lintian failed: %v", err)
	}

	// Install with Debian's containerd 1.6: no drop-in (1.x would let it
	// replace the operator's whole CRI section); the package says what to
	// add instead, and prints check's result.
	inst := mustRun(t, nil, "dpkg", "-i", deb1)
	wantContains(t, "postinst on containerd 1.6", inst,
		"containerd 1.6", "add the kvm runtime to the CRI section of "+ctrdConf,
		`[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kvm]`,
		pkg+": "+pkg+" check:", "ok    config")
	if v := installedVersion(t); v != "0.0.0+debtest1" {
		t.Fatalf("installed version %q, want 0.0.0+debtest1", v)
	}
	for _, p := range []string{shimPath, wrapper} {
		if fi, statErr := os.Stat(p); statErr != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("%s: %v, mode %v; want an executable", p, statErr, fi)
		}
	}
	conf, err := os.ReadFile(conffile)
	if err != nil || !strings.Contains(string(conf), `qemu_wrapper = "`+wrapper+`"`) {
		t.Errorf("%s does not name the packaged wrapper (%v):\n%s", conffile, err, conf)
	}
	if exists(dropIn) {
		t.Errorf("on containerd 1.6 the package wrote %s", dropIn)
	}
	mustRun(t, nil, shimPath, "-v")

	// What it says to add works with containerd 1.6: kvm beside runc, the
	// operator's CNI path kept.
	// The lines as printed: from the first table header on.
	i, j := strings.Index(inst, `[plugins."io.containerd.grpc.v1.cri".containerd`), strings.Index(inst, pkg+": then restart containerd.")
	if i < 0 || j < i {
		t.Fatalf("postinst printed no runtime lines to add:\n%s", inst)
	}
	printed := inst[i:j]
	wantContains(t, "postinst on a config without runc", printed, `containerd.runtimes.runc]`)
	merged := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(merged, append(append(bytes.Clone(ctrdConfBefore), '\n'), printed...), 0o644); err != nil {
		t.Fatal(err)
	}
	dump := configDump(t, "/usr/bin/containerd", merged)
	wantContains(t, "containerd 1.6 with the printed lines", dump,
		`containerd.runtimes.kvm]`, `containerd.runtimes.runc]`, `runtime_type = "io.containerd.kvm.v1"`, `bin_dir = "/usr/lib/cni"`)
	wantContains(t, "check with the printed lines", mustRun(t, nil, shimPath, "check", "-containerd-config", merged),
		"ok    containerd")

	// The operator changes the config; a VM's data is in the state dir.
	if err := os.WriteFile(conffile, append(conf, []byte(operators+"\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	vmData := filepath.Join(stateDir, "vms", "kvm-debtest-vm")
	// As the shim makes them (shim/naming.go): traversable state dirs.
	if err := os.MkdirAll(filepath.Dir(vmData), 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(vmData, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(vmData) })
	overlay := filepath.Join(vmData, "overlay.qcow2")
	if err := os.WriteFile(overlay, []byte("a VM's disk writes\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	// Upgrade with containerd 2.x: the drop-in goes to conf.d, and since
	// Debian's config.toml imports nothing, the package says which line to add.
	path := "PATH=" + filepath.Dir(c2.Containerd) + ":" + os.Getenv("PATH")
	up := mustRun(t, []string{path}, "dpkg", "--force-confold", "-i", deb2)
	wantContains(t, "postinst on containerd 2.x", up,
		"wrote the kvm runtime to "+dropIn,
		ctrdConf+" does not import /etc/containerd/conf.d",
		`imports = ["/etc/containerd/conf.d/*.toml"]`)
	if v := installedVersion(t); v != "0.0.0+debtest2" {
		t.Fatalf("after the upgrade the installed version is %q, want 0.0.0+debtest2", v)
	}
	if conf, _ := os.ReadFile(conffile); !strings.Contains(string(conf), operators) {
		t.Errorf("the upgrade lost the operator's change to %s", conffile)
	}
	// The drop-in adds kvm to containerd 2.x and keeps runc and the CNI path.
	v3 := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(v3, []byte("version = 3\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n"+
		"[plugins.\"io.containerd.cri.v1.runtime\".cni]\n  bin_dirs = [\"/usr/lib/cni\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dump = configDump(t, c2.Containerd, v3)
	wantContains(t, "containerd 2.x with the drop-in", dump,
		`containerd.runtimes.kvm]`, `containerd.runtimes.runc]`, `runtime_type = 'io.containerd.kvm.v1'`, `'/usr/lib/cni'`)
	wantContains(t, "check with the drop-in", mustRun(t, nil, shimPath, "check", "-containerd-config", v3),
		"ok    containerd")

	// Remove: the binaries and the drop-in go; the config and the VM's data stay.
	rm := mustRun(t, nil, "dpkg", "--remove", pkg)
	wantContains(t, "remove", rm, "removed "+dropIn, "VM data under "+stateDir+" is kept")
	for _, p := range []string{shimPath, wrapper, dropIn} {
		if exists(p) {
			t.Errorf("%s is still there after remove", p)
		}
	}
	if !exists(conffile) {
		t.Errorf("remove took %s (only purge may)", conffile)
	}
	if b, err := os.ReadFile(overlay); err != nil || string(b) != "a VM's disk writes\n" {
		t.Errorf("remove touched a VM's data: %v %q", err, b)
	}

	// Purge: the config goes too; the VM's data stays.
	purge := mustRun(t, nil, "dpkg", "--purge", pkg)
	wantContains(t, "purge", purge, "VM data under "+stateDir+" is kept")
	if exists(filepath.Dir(conffile)) {
		t.Errorf("%s is still there after purge", filepath.Dir(conffile))
	}
	if b, err := os.ReadFile(overlay); err != nil || string(b) != "a VM's disk writes\n" {
		t.Errorf("purge touched a VM's data: %v %q", err, b)
	}
	if after, err := os.ReadFile(ctrdConf); err != nil || !bytes.Equal(after, ctrdConfBefore) {
		t.Errorf("%s changed (%v); the package must never edit it", ctrdConf, err)
	}
}
