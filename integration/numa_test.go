//go:build integration

package integration

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// annNUMAMode chooses a VM's NUMA placement (docs/annotations.md, shim/numa.go).
const annNUMAMode = "kvm.containerd.io/numa-mode"

// TestCtrNUMA checks, on one containerd, that a VM is placed as its
// reservation says: the domain XML pins it (strict numatune, vcpu cpuset;
// in dedicated mode a vcpupin per vCPU and an emulatorpin on other CPUs),
// QEMU's threads run where the XML says, `check` lists the reservation,
// and deleting the VM releases it.
func TestCtrNUMA(t *testing.T) {
	s := requireKVM(t, "kernel")
	c := s.flavours[0]
	t.Run(c.Flavour.Name, func(t *testing.T) {
		c.watch(t)
		t.Run("node", func(t *testing.T) {
			c.cleanupAfter(t)
			id := "it-numa-node"
			d := c.runDetached(t, id, "kernel")
			pid := c.taskPid(t, id)
			checkNUMATune(t, d, pid)
			if d.VCPU.CPUSet == "" {
				t.Errorf("no <vcpu cpuset>:\n%s", d.raw)
			}
			checkAffinity(t, pid, 0, "QEMU (emulator threads float with the vCPUs)", d.VCPU.CPUSet)
			for _, tid := range vcpuThreads(t, pid, d.vcpus()) {
				checkAffinity(t, pid, tid, "vCPU thread", d.VCPU.CPUSet)
			}
			c.checkReservation(t, d.Name+"/"+id, "node", d.VCPU.CPUSet, "")
			c.killAndDelete(t, id)
			c.checkReleased(t, d.Name)
			assertNothingLeft(t, c, shimID{nsDefault, id})
		})
		t.Run("dedicated", func(t *testing.T) {
			c.cleanupAfter(t)
			id := "it-numa-dedicated"
			d := c.runDetached(t, id, "kernel", annNUMAMode+"=dedicated")
			pid := c.taskPid(t, id)
			checkNUMATune(t, d, pid)
			pins := d.CPUTune.VCPUPins
			if d.vcpus() != 1 || len(pins) != 1 || pins[0].VCPU != 0 || d.CPUTune.EmulatorPin == nil {
				t.Fatalf("a 1-vCPU dedicated VM wants one <vcpupin vcpu=0> and an <emulatorpin>:\n%s", d.raw)
			}
			vcpu, _ := cpuList(pins[0].CPUSet)
			emu, _ := cpuList(d.CPUTune.EmulatorPin.CPUSet)
			if len(vcpu) != 1 || len(emu) == 0 || slices.Contains(emu, vcpu[0]) {
				t.Errorf("vcpupin %q and emulatorpin %q: want one CPU for the vCPU and other CPUs for the emulator",
					pins[0].CPUSet, d.CPUTune.EmulatorPin.CPUSet)
			}
			checkAffinity(t, pid, 0, "QEMU's emulator thread", d.CPUTune.EmulatorPin.CPUSet)
			for _, tid := range vcpuThreads(t, pid, 1) {
				checkAffinity(t, pid, tid, "vCPU 0 thread", pins[0].CPUSet)
			}
			c.checkReservation(t, d.Name+"/"+id, "dedicated", pins[0].CPUSet, d.CPUTune.EmulatorPin.CPUSet)
			c.killAndDelete(t, id)
			c.checkReleased(t, d.Name)
			assertNothingLeft(t, c, shimID{nsDefault, id})
		})
	})
}

// taskPid returns the pid `ctr task ls` reports: QEMU's for a VM.
func (c *containerd) taskPid(t *testing.T, id string) int {
	t.Helper()
	_, pid, err := c.taskStatus(nsDefault, id)
	if err != nil || pid <= 0 {
		t.Fatalf("task %s pid %d: %v", id, pid, err)
	}
	return pid
}

// checkNUMATune checks a strict <numatune> and that QEMU's memory is
// allowed exactly on its nodeset.
func checkNUMATune(t *testing.T, d *domain, pid int) {
	t.Helper()
	if d.NUMATune == nil || d.NUMATune.Memory.Mode != "strict" || d.NUMATune.Memory.NodeSet == "" {
		t.Errorf("want <numatune><memory mode='strict' nodeset=...>:\n%s", d.raw)
		return
	}
	mems, err := procStatus(pid, 0, "Mems_allowed_list")
	if err != nil {
		t.Error(err)
		return
	}
	if same, err := sameCPUs(mems, d.NUMATune.Memory.NodeSet); err != nil || !same {
		t.Errorf("QEMU (pid %d) Mems_allowed_list %q, want the numatune nodeset %q (%v)", pid, mems, d.NUMATune.Memory.NodeSet, err)
	}
}

// checkAffinity compares a thread's Cpus_allowed_list with a CPU list.
func checkAffinity(t *testing.T, pid, tid int, what, want string) {
	t.Helper()
	got, err := procStatus(pid, tid, "Cpus_allowed_list")
	if err != nil {
		t.Error(err)
		return
	}
	if same, err := sameCPUs(got, want); err != nil || !same {
		t.Errorf("%s (pid %d, tid %d) Cpus_allowed_list %q, want %q from the domain XML (%v)", what, pid, tid, got, want, err)
	}
}

// vcpuThreads waits for QEMU's n vCPU threads (named "CPU <i>/TCG" or
// "CPU <i>/KVM": libvirt starts QEMU with debug-threads=on).
func vcpuThreads(t *testing.T, pid, n int) []int {
	t.Helper()
	var tids []int
	if err := poll(30*time.Second, func() (bool, string) {
		var err error
		tids, err = threadsNamed(pid, "CPU ")
		return err == nil && len(tids) == n, fmt.Sprintf("vCPU threads of pid %d: %v (%v), want %d", pid, tids, err, n)
	}); err != nil {
		t.Fatal(err)
	}
	return tids
}

// checkReservation checks that owner holds a reservation in the shim's
// NUMA store and that `containerd-shim-kvm-v1 check` lists it with its mode,
// CPUs and emulator CPUs ("" for none).
func (c *containerd) checkReservation(t *testing.T, owner, mode, cpus, emulator string) {
	t.Helper()
	owners, err := numaOwners(c.NUMAStateFile)
	if err != nil || !slices.Contains(owners, owner) {
		t.Errorf("%s holds no reservation in %s: owners %q (%v)", owner, c.NUMAStateFile, owners, err)
	}
	out, err := runWithTimeout(exec.Command(filepath.Join(c.suite.binDir, shimBinary), "check", "--config", c.ShimConfigPath), time.Minute)
	// check exits 1 when something it looks at fails (e.g. no containerd
	// config at the default path); its NUMA report is what counts here.
	var line string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, owner+" ") {
			line = l
		}
	}
	f := strings.Fields(line)
	// Columns: owner mode nodes vcpus memory ("256 MiB") cpus emulator-cpus.
	if len(f) < 7 || f[1] != mode {
		t.Errorf("check --config %s (%v) lists no %s reservation for %s:\n%s", c.ShimConfigPath, err, mode, owner, out)
		return
	}
	for _, col := range []struct{ name, got, want string }{
		{"CPUs", f[len(f)-2], cpus}, {"emulator CPUs", f[len(f)-1], emulator},
	} {
		if col.got == "-" && col.want == "" {
			continue
		}
		if same, err := sameCPUs(col.got, col.want); err != nil || !same {
			t.Errorf("check lists %s %q for %s, want %q as in the domain XML:\n%s", col.name, col.got, owner, col.want, line)
		}
	}
	t.Logf("check: %s", strings.Join(f, " "))
}

// checkReleased checks that no reservation of domain is left in the store.
func (c *containerd) checkReleased(t *testing.T, domain string) {
	t.Helper()
	if err := poll(leftoverTimeout, func() (bool, string) {
		owners, err := numaOwners(c.NUMAStateFile)
		for _, o := range owners {
			if strings.HasPrefix(o, domain+"/") {
				return false, fmt.Sprintf("%s still reserved in %s", o, c.NUMAStateFile)
			}
		}
		return err == nil, fmt.Sprint(err)
	}); err != nil {
		t.Errorf("after delete: %v", err)
	}
}
