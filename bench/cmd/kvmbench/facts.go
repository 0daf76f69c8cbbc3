package main

import (
	"bufio"
	"context"
	"debug/buildinfo"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// facts describe the machine a result was measured on.
type facts struct {
	CPU          string   `json:"cpu"`
	Cores        int      `json:"cores"`
	Kernel       string   `json:"kernel"`
	MemoryMiB    int      `json:"memory_mib"`
	NUMANodes    int      `json:"numa_nodes"`
	Node0MiB     int      `json:"node0_memory_mib"`
	Accel        string   `json:"accel"`
	AccelWhy     string   `json:"accel_reason"`
	Containerd   []string `json:"containerd"`
	Libvirt      string   `json:"libvirt"`
	QEMU         string   `json:"qemu"`
	Runc         string   `json:"runc"`
	RuncShim     string   `json:"runc_shim"`
	Shim         string   `json:"shim"`
	Go           string   `json:"go"`
	Revision     string   `json:"revision"`
	LoadAtStart  string   `json:"loadavg_at_start"`
	OtherQEMU    int      `json:"other_qemu_processes_at_start"`
	GuestKernel  string   `json:"guest_kernel"`
	GuestCmdline string   `json:"guest_cmdline"`
}

func machineFacts(ctx context.Context, c *config) (facts, error) {
	f := facts{Cores: runtime.NumCPU(), Go: runtime.Version(), Accel: "tcg"}
	f.CPU = cpuModel()
	var u unix.Utsname
	if err := unix.Uname(&u); err == nil {
		f.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	f.MemoryMiB = meminfoMiB("/proc/meminfo", "MemTotal:")
	f.Node0MiB = meminfoMiB("/sys/devices/system/node/node0/meminfo", "Node 0 MemTotal:")
	nodes, _ := filepath.Glob("/sys/devices/system/node/node[0-9]*")
	f.NUMANodes = len(nodes)
	f.AccelWhy = accelReason()
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		f.LoadAtStart = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	f.OtherQEMU = otherQEMU("")
	f.QEMU = firstLine(ctx, "/usr/bin/qemu-system-x86_64", "--version")
	f.Runc = firstLine(ctx, "runc", "--version")
	f.RuncShim = runcShimFacts(c.flavours)
	f.Shim = shimVersion(output(ctx, filepath.Join(c.binDir, shimBinary), "-v"))
	f.Revision = strings.TrimSpace(output(ctx, "git", "describe", "--always", "--dirty"))
	f.GuestKernel = "Debian cloud kernel of hack/guest/build.sh " + strings.TrimSpace(readFile("_output/guest-build/kernel.ref"))
	f.GuestCmdline = "console=ttyS0 (the shim's default kernel_cmdline)"
	if c.needsDaemons() {
		l, err := testenv.ConnectLibvirt()
		if err != nil {
			return f, err
		}
		if v, err := l.ConnectGetLibVersion(); err == nil {
			f.Libvirt = fmt.Sprintf("%d.%d.%d", v/1000000, v/1000%1000, v%1000)
		}
		_ = l.Disconnect()
	}
	return f, nil
}

// shimVersion picks "Version: X" out of the shim's -v output.
func shimVersion(out string) string {
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "Version:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return strings.TrimSpace(out)
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// meminfoMiB reads "<key> <n> kB" from a meminfo file.
func meminfoMiB(path, key string) int {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), key); ok {
			fields := strings.Fields(rest)
			if len(fields) > 0 {
				kb, _ := strconv.Atoi(fields[0])
				return kb / 1024
			}
		}
	}
	return 0
}

// accelReason says why guests run under TCG here: every section uses
// accel = "tcg", and on this project's machines /dev/kvm is a
// paravirtualized KVM that cannot boot stock guest kernels.
func accelReason() string {
	if _, err := os.Stat("/sys/module/kvm_pvm"); err == nil {
		return "/dev/kvm is paravirtualized KVM (kvm_pvm), which cannot boot stock guest kernels: every guest runs under TCG (software emulation)"
	}
	if _, err := os.Stat("/dev/kvm"); err != nil {
		return "no /dev/kvm: every guest runs under TCG (software emulation)"
	}
	return "the benchmark configures accel = \"tcg\": every guest runs under TCG (software emulation)"
}

func firstLine(ctx context.Context, name string, args ...string) string {
	out := strings.TrimSpace(output(ctx, name, args...))
	line, _, _ := strings.Cut(out, "\n")
	return line
}

func output(ctx context.Context, name string, args ...string) string {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("(%s: %v)", name, err)
	}
	return string(out)
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// runcShimFacts says which runc shim each flavour's daemon runs (the one
// of its own release, testenv.Flavour.RuncShim) and which Go built it: the
// Go runtime's own share of a shim's memory differs between releases.
func runcShimFacts(flavours []string) string {
	var parts []string
	for _, name := range flavours {
		f, err := testenv.LookupFlavour(name)
		if err != nil {
			continue
		}
		what := name + ": " + f.RuncShim
		if f.RuncShim == "/usr/bin/containerd-shim-runc-v2" {
			what += " (Debian's containerd package)"
		}
		if bi, err := buildinfo.ReadFile(f.RuncShim); err == nil {
			what += ", built with " + bi.GoVersion
			if bi.Main.Version != "" && bi.Main.Version != "(devel)" {
				what += " from " + bi.Main.Path + "@" + bi.Main.Version
			}
		} else {
			what += " (missing: run hack/setup-host.sh)"
		}
		parts = append(parts, what)
	}
	return strings.Join(parts, "; ")
}
