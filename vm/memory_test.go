package vm

import (
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"
)

// A live virtio-mem device as libvirt 9.0 writes it.
const liveVirtioMem = `<domain><devices><memory model='dimm'><target><size unit='KiB'>1024</size></target></memory>
<memory model='virtio-mem'>
  <source><pagesize unit='KiB'>2048</pagesize></source>
  <target>
    <size unit='KiB'>786432</size>
    <node>0</node>
    <block unit='KiB'>2048</block>
    <requested unit='KiB'>262144</requested>
    <current unit='KiB'>131072</current>
  </target>
  <alias name='virtiomem0'/>
  <address type='pci' domain='0x0000' bus='0x01' slot='0x00' function='0x0'/>
</memory></devices></domain>`

func TestVirtioMemRoundTrip(t *testing.T) {
	m, ok, err := virtioMemFromXML(liveVirtioMem)
	if err != nil || !ok {
		t.Fatalf("virtio-mem device not found: %v", err)
	}
	p, err := m.plugged()
	if err != nil {
		t.Fatal(err)
	}
	if p != (PluggedMemory{RequestedMiB: 256, CurrentMiB: 128, SizeMiB: 768}) {
		t.Fatalf("plugged = %+v", p)
	}
	// The update repeats source, alias and address, so that libvirt
	// finds the device and sees only requested change.
	m.dev.Target.Requested = &libvirtxml.DomainMemorydevTargetRequested{Unit: "KiB", Value: 512 * 1024}
	out, err := m.dev.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`<memory model="virtio-mem">`, `<pagesize unit="KiB">2048</pagesize>`, `<alias name="virtiomem0"></alias>`,
		`<address type="pci" domain="0x0000" bus="0x01" slot="0x00" function="0x0">`,
		`<requested unit="KiB">524288</requested>`, `<node>0</node>`} {
		if !strings.Contains(out, want) {
			t.Errorf("update XML lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, "current") {
		t.Errorf("update XML carries current:\n%s", out)
	}
}

func TestVirtioMemAbsent(t *testing.T) {
	dimm := `<domain><devices><memory model='dimm'><target><size unit='KiB'>1024</size></target></memory></devices></domain>`
	_, ok, err := virtioMemFromXML(dimm)
	if err != nil || ok {
		t.Fatalf("found a virtio-mem device in a domain without one (err %v)", err)
	}
	if _, _, err := virtioMemFromXML(`<domain><devices>`); err == nil {
		t.Fatal("truncated XML parsed")
	}
}

func TestHotplugMemoryMiB(t *testing.T) {
	for _, c := range []struct {
		mem, max int
		pageKiB  uint64
		want     int
	}{
		{512, 0, 0, 0}, {512, 512, 0, 0}, {512, 1024, 0, 512}, {512, 1025, 0, 512},
		{1024, 4000, 1024 * 1024, 2048}, {512, 515, 0, 2},
	} {
		s := Spec{MemoryMiB: c.mem, MaxMemoryMiB: c.max, HugePageKiB: c.pageKiB}
		if got := HotplugMemoryMiB(&s); got != c.want {
			t.Errorf("mem %d max %d page %d KiB: %d MiB, want %d", c.mem, c.max, c.pageKiB, got, c.want)
		}
	}
}
