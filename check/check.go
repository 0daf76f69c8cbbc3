package check

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pelletier/go-toml/v2"

	"github.com/kvm-shim/containerd-shim-kvm-v1/config"
	"github.com/kvm-shim/containerd-shim-kvm-v1/hostid"
	"github.com/kvm-shim/containerd-shim-kvm-v1/netfd"
	"github.com/kvm-shim/containerd-shim-kvm-v1/numa"
	"github.com/kvm-shim/containerd-shim-kvm-v1/shim"
	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

type checkLevel string

const (
	checkOK   checkLevel = "ok"
	checkWarn checkLevel = "warn"
	checkFail checkLevel = "FAIL"
)

type checkResult struct {
	level      checkLevel
	name, note string
}

// checkList collects the results of `check` in the order they print.
type checkList []checkResult

func (c *checkList) add(l checkLevel, name, format string, a ...any) {
	*c = append(*c, checkResult{l, name, fmt.Sprintf(format, a...)})
}

// Run is the `check` subcommand: it prints what the host has and lacks
// for running VM tasks and returns 1 when a hard requirement is missing.
func Run(ctx context.Context, w io.Writer, args []string) int {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(w)
	cfgPath := fs.String("config", "", "shim config file (default "+config.DefaultPath+")")
	ctrdCfg := fs.String("containerd-config", "/etc/containerd/config.toml", "containerd config to look for the runtime in")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var c checkList
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		c.add(checkFail, "config", "%v", err)
		cfg = config.Default()
	} else {
		c.add(checkOK, "config", "accel=%s state_dir=%s machine=%s", cfg.Accel, cfg.StateDir, cfg.Machine)
	}

	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c.checkLibvirt(ctx, cfg)
	c.checkTools(ctx, cfg)
	c.checkNetwork(cfg)
	l, note := checkCgroups()
	c.add(l, "cgroups", "%s", note)
	c.add(checkOK, "overhead", "%s", overheadNote())
	numaReport := c.checkNUMA(cfg)
	ids, inUse := checkIdentityRange(cfg)
	c = append(c, confinementChecks(readConfineHost(), ids, inUse)...)
	c.checkStateDir(cfg)
	c.checkContainerd(*ctrdCfg)
	return c.print(w, numaReport)
}

// checkLibvirt reports whether libvirtd answers and how KVM acceleration
// stands.
func (c *checkList) checkLibvirt(ctx context.Context, cfg config.Config) {
	if conn, err := vm.Connect(ctx, cfg.LibvirtSocket); err != nil {
		c.add(checkFail, "libvirt", "%v", err)
	} else {
		v, err := conn.Version()
		conn.Close()
		if err != nil {
			c.add(checkFail, "libvirt", "%v", err)
		} else {
			c.add(checkOK, "libvirt", "libvirtd %s at %s", v, cfg.LibvirtSocket)
		}
	}

	kvm := vm.DetectKVM()
	switch accel, warning, err := vm.ChooseAccel(cfg.Accel, kvm); {
	case err != nil:
		c.add(checkFail, "acceleration", "%v", err)
	case warning != "":
		c.add(checkWarn, "acceleration", "%s", warning)
	default:
		c.add(checkOK, "acceleration", "%s (%s)", accel, kvm.Reason)
	}
}

// checkTools reports the versions of QEMU, qemu-img and virtiofsd.
func (c *checkList) checkTools(ctx context.Context, cfg config.Config) {
	for _, tool := range []struct{ name, path string }{{"qemu", cfg.QEMUBinary}, {"qemu-img", cfg.QEMUImg}} {
		out, err := exec.CommandContext(ctx, tool.path, "--version").Output()
		if err != nil {
			c.add(checkFail, tool.name, "%s: %v", tool.path, err)
			continue
		}
		c.add(checkOK, tool.name, "%s", strings.SplitN(strings.TrimSpace(string(out)), "\n", 2)[0])
	}

	if cfg.PlainContainers {
		// containerd's runc task code runs "runc" from PATH.
		if out, err := exec.CommandContext(ctx, "runc", "--version").Output(); err != nil {
			c.add(checkFail, "runc", "runc: %v (plain_containers is on: plain containers and every pod's sandbox need it)", err)
		} else {
			c.add(checkOK, "runc", "%s", strings.SplitN(strings.TrimSpace(string(out)), "\n", 2)[0])
		}
	}

	if out, err := exec.CommandContext(ctx, cfg.Virtiofsd, "--version").Output(); err != nil {
		c.add(checkWarn, "virtiofsd", "%s: %v (pods with shared volumes will fail)", cfg.Virtiofsd, err)
	} else {
		c.add(checkOK, "virtiofsd", "%s", strings.SplitN(strings.TrimSpace(string(out)), "\n", 2)[0])
	}
}

// checkNetwork reports the TAP and vhost-net features and the emulator
// wrapper that hands their descriptors to QEMU.
func (c *checkList) checkNetwork(cfg config.Config) {
	if vnetHdr, mq, err := netfd.Features(); err != nil {
		c.add(checkFail, "tun", "/dev/net/tun: %v (needed for pod networking)", err)
	} else if !vnetHdr || !mq {
		c.add(checkWarn, "tun", "/dev/net/tun lacks IFF_VNET_HDR (%v) or IFF_MULTI_QUEUE (%v)", vnetHdr, mq)
	} else {
		c.add(checkOK, "tun", "/dev/net/tun with IFF_VNET_HDR and IFF_MULTI_QUEUE")
	}
	if ok, why := netfd.VhostAvailable(); ok {
		c.add(checkOK, "vhost-net", "%s opens (used by KVM guests)", netfd.VhostNetPath)
	} else {
		c.add(checkWarn, "vhost-net", "%s; KVM guests fall back to userspace virtio-net (try modprobe vhost_net)", why)
	}
	if _, err := os.Stat(cfg.QEMUWrapper); err != nil {
		c.add(checkFail, "wrapper", "qemu_wrapper %v (make install puts it there)", err)
	} else {
		c.add(checkOK, "wrapper", "%s", cfg.QEMUWrapper)
	}
}

// checkCapacity reports the node's VM capacity as Kubernetes is told it
// (the node installer advertises the same figure).
func (c *checkList) checkCapacity(t *numa.Topology, p numa.Policy) {
	n, err := numa.VCPUCapacity(t, p)
	if err != nil {
		c.add(checkWarn, "capacity", "%v", err)
		return
	}
	c.add(checkOK, "capacity", "%s: %d (the node's floating vCPUs under cpu_threshold %g; advertise it in the node's status, "+
		"as the node installer does)", numa.VCPUResource, n, p.WithDefaults().CPUThreshold)
}

// checkNUMA reports the NUMA store and returns the topology and
// reservations report printed after the table ("" when unreadable).
func (c *checkList) checkNUMA(cfg config.Config) string {
	var numaReport strings.Builder
	if store, err := shim.OpenNUMA(cfg); err != nil {
		c.add(checkFail, "numa", "%v", err)
	} else if ps, err := store.Snapshot(); err != nil {
		c.add(checkWarn, "numa", "read reservations: %v", err)
	} else {
		c.add(checkOK, "numa", "%d node(s), %d VM(s) placed (%s)", len(store.Topology().Nodes), len(ps), cfg.NUMAStateFile)
		_ = numa.Describe(&numaReport, store.Topology(), store.Policy(), ps)
		c.checkCapacity(store.Topology(), store.Policy())
	}
	return numaReport.String()
}

// checkIdentityRange returns the per-VM identity range (nil: off or
// unparsable, which the config check reports) and how many of its ids
// are allocated.
func checkIdentityRange(cfg config.Config) (*hostid.Range, int) {
	if cfg.VMIDRange == "" {
		return nil, 0
	}
	r, err := hostid.ParseRange(cfg.VMIDRange)
	if err != nil {
		return nil, 0
	}
	inUse := 0
	if store, err := hostid.OpenStore(cfg.VMIDStateFile, r); err == nil {
		if snap, err := store.Snapshot(); err == nil {
			inUse = len(snap)
		}
	}
	return &r, inUse
}

// checkStateDir reports whether QEMU can reach the state dir. The shim
// creates the state dir; what must already hold is that QEMU can reach it
// through its existing ancestors.
func (c *checkList) checkStateDir(cfg config.Config) {
	existing := cfg.StateDir
	for {
		if _, err := os.Stat(existing); err == nil || existing == "/" {
			break
		}
		existing = filepath.Dir(existing)
	}
	if err := shim.CheckSearchable(existing); err != nil {
		c.add(checkFail, "state dir", "%v", err)
	} else {
		c.add(checkOK, "state dir", "%s", cfg.StateDir)
	}
}

// checkContainerd reports whether containerd's config declares the runtime.
func (c *checkList) checkContainerd(ctrdCfg string) {
	if found, err := runtimeRegistered(ctrdCfg); err != nil {
		c.add(checkWarn, "containerd", "%v", err)
	} else if !found {
		c.add(checkWarn, "containerd", "%s declares no runtime with runtime_type = %q (see docs/install.md)", ctrdCfg, shim.RuntimeName)
	} else {
		c.add(checkOK, "containerd", "%s declares runtime_type %q", ctrdCfg, shim.RuntimeName)
	}
}

// print writes the results as a table, then the NUMA report, and returns
// check's exit status: 1 when any result failed.
func (c checkList) print(w io.Writer, numaReport string) int {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	code := 0
	for _, r := range c {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r.level, r.name, r.note)
		if r.level == checkFail {
			code = 1
		}
	}
	tw.Flush()
	if numaReport != "" {
		fmt.Fprintf(w, "\nNUMA topology and reservations:\n%s", numaReport)
	}
	return code
}

// runtimeRegistered looks through a containerd config (version 2 or 3)
// for any table with runtime_type = io.containerd.kvm.v1.
func runtimeRegistered(path string) (bool, error) {
	return runtimeRegisteredIn(path, 0)
}

// maxImportDepth bounds the imports runtimeRegistered follows: containerd
// itself reads the imports of the main file only, but a loop of imports
// must not hang check.
const maxImportDepth = 4

// runtimeRegisteredIn reads one containerd config file and the files its
// `imports` name (globs; relative ones against the file's directory), as
// containerd does: the Debian package puts the runtime in a drop-in under
// /etc/containerd/conf.d on containerd 2.x.
func runtimeRegisteredIn(path string, depth int) (bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return false, err
	}
	var doc map[string]any
	if err := toml.Unmarshal(b, &doc); err != nil {
		return false, fmt.Errorf("parse %s: %w", path, err)
	}
	if hasRuntimeType(doc) {
		return true, nil
	}
	imports, _ := doc["imports"].([]any)
	if depth >= maxImportDepth {
		return false, nil
	}
	for _, imp := range imports {
		pattern, ok := imp.(string)
		if !ok {
			continue
		}
		if !filepath.IsAbs(pattern) {
			pattern = filepath.Join(filepath.Dir(path), pattern)
		}
		files, err := filepath.Glob(pattern)
		if err != nil {
			return false, fmt.Errorf("%s: imports %q: %w", path, pattern, err)
		}
		for _, f := range files {
			if found, err := runtimeRegisteredIn(f, depth+1); err != nil || found {
				return found, err
			}
		}
	}
	return false, nil
}

func hasRuntimeType(v any) bool {
	m, ok := v.(map[string]any)
	if !ok {
		return false
	}
	if m["runtime_type"] == shim.RuntimeName {
		return true
	}
	for _, child := range m {
		if hasRuntimeType(child) {
			return true
		}
	}
	return false
}

// overheadNote is `check`'s line on the overhead to declare.
func overheadNote() string {
	return fmt.Sprintf("declare RuntimeClass overhead.podFixed memory: %dMi "+
		"(measured under TCG with all guest RAM touched; see docs/resources.md)",
		shim.PodFixedOverheadMiB)
}
