package vm

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestVolumesDefine has the host's libvirtd (9.0 here) define the volume
// domains, every kind with memfd, and with memfd or huge pages on guest
// NUMA cells:
// its own checks (virtiofs needs shared memory, a block disk's serial)
// go beyond the schema. A share without shared memory is refused, which
// is why configureShares sets it.
func TestVolumesDefine(t *testing.T) {
	if testing.Short() {
		t.Skip("talks to the host's libvirtd")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root for libvirtd's read-write socket")
	}
	if libvirtdPID(t) == "" {
		t.Skip("libvirtd is not running (hack/setup-host.sh starts it)")
	}
	c, err := Connect(context.Background(), DefaultSocket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	define := func(i int, spec Spec) error {
		spec.Name = fmt.Sprintf("kvm-voltest-%d-%d", os.Getpid(), i)
		spec.UUID = fmt.Sprintf("6f1c2a4e-8d3b-5e7f-9a%02x-%012x", i, os.Getpid())
		out, renderErr := Render(&spec)
		if renderErr != nil {
			t.Fatal(renderErr)
		}
		if defineErr := c.Define(out); defineErr != nil {
			return defineErr
		}
		return c.Undefine(spec.Name)
	}
	cases := goldenCases()
	for i, name := range []string{"volumes", "volumes-hugepages-numa", "volumes-numa-memfd"} {
		if defineErr := define(i, cases[name]); defineErr != nil {
			t.Errorf("libvirtd refuses %s: %v", name, defineErr)
		}
	}
	// The most volumes a spec may have: libvirtd, which assigns PCI
	// addresses at define (a root port each), finds room for all of them
	// beside the config drive (and a NIC the shim adds later).
	full := cases["volumes"]
	full.VolumeDisks, full.Shares = nil, nil
	full.ConfigDrive = &ConfigDrive{Path: "/c", Format: "vfat"}
	for i := 0; i < MaxVolumeDisks; i++ {
		full.VolumeDisks = append(full.VolumeDisks,
			VolumeDisk{Name: "/v", Path: fmt.Sprintf("/dev/loop%d", i), Block: true, Format: "raw", Serial: fmt.Sprint("d", i)})
	}
	for i := 0; i < MaxShares; i++ {
		full.Shares = append(full.Shares, Share{Name: "/s", Source: "/tmp", Tag: fmt.Sprint("s", i)})
	}
	if err = define(9, full); err != nil {
		t.Errorf("libvirtd refuses %d disk volumes and %d shares: %v", MaxVolumeDisks, MaxShares, err)
	}

	// The same share without shared memory, as a renderer that forgot it
	// would write it: libvirt must refuse it.
	spec := cases["volumes"]
	out, err := Render(&spec)
	if err != nil {
		t.Fatal(err)
	}
	spec.Name = fmt.Sprintf("kvm-voltest-%d-noshm", os.Getpid())
	noShared := strings.Replace(string(out), `<access mode="shared"></access>`, "", 1)
	noShared = strings.Replace(noShared, "<name>kvm-default-vm1-0123456789ab</name>", "<name>"+spec.Name+"</name>", 1)
	err = c.Define([]byte(noShared))
	if err == nil {
		_ = c.Undefine(spec.Name)
		t.Fatal("libvirtd defined a virtiofs share without shared memory")
	}
	if !strings.Contains(err.Error(), "requires shared memory") {
		t.Errorf("refused for another reason: %v", err)
	}
}
