package vm

import (
	"encoding/xml"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/containerd/errdefs"
	"libvirt.org/go/libvirtxml"
)

// FuzzImageFormat feeds arbitrary image headers and names to the qcow2
// header probe that runs before qemu-img or QEMU open a user's image. Run
// it with
//
//	go test -run='^$' -fuzz=FuzzImageFormat -fuzztime=30s ./vm/
//
// Properties: no panic; a refusal is InvalidArgument; an image accepted as
// qcow2 starts with the qcow2 magic, names no backing file and, from
// version 3, no external data file; an image with the qcow2 magic is only
// taken as raw when its name says .raw (QEMU then never reads the header);
// a .qcow2 name is never taken as raw.
// The seed corpus is below and in testdata/fuzz/FuzzImageFormat.
func FuzzImageFormat(f *testing.F) {
	v3 := qcow2Header(3, 0, 0)
	f.Add(v3, "disk.qcow2")
	f.Add(v3, "disk.img")
	f.Add(v3, "disk.raw")
	f.Add(qcow2Header(2, 0x1000, 0), "disk.img")
	f.Add(qcow2Header(3, 0, qcow2DataFileBit), "disk.QCOW2")
	f.Add(qcow2Header(3, 0, 0)[:80], "disk.img")
	f.Add(qcow2Header(2, 0, 0)[:72], "disk.img")
	f.Add([]byte("QFI"), "x.qcow2")
	f.Add([]byte{}, "empty.img")
	f.Add([]byte("\x7fELF"), "disk")
	f.Fuzz(func(t *testing.T, hdr []byte, name string) {
		if len(hdr) > 4096 {
			hdr = hdr[:4096]
		}
		p := filepath.Join(t.TempDir(), "image")
		if err := os.WriteFile(p, hdr, 0o600); err != nil {
			t.Fatal(err)
		}
		format, err := imageFormat(p, name)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("refusal is not InvalidArgument: %v", err)
			}
			return
		}
		magic := len(hdr) >= 4 && string(hdr[:4]) == qcow2Magic
		ext := strings.ToLower(filepath.Ext(name))
		switch format {
		case "raw":
			if ext == ".qcow2" || (magic && ext != ".raw") {
				t.Fatalf("%s with header %q taken as raw", name, hdr[:min(len(hdr), 8)])
			}
		case "qcow2":
			if !magic || len(hdr) < qcow2IncompatOffset {
				t.Fatalf("%s taken as qcow2 without a whole header", name)
			}
			if be64(hdr[qcow2BackingOffset:]) != 0 {
				t.Fatalf("%s taken as qcow2 with a backing file", name)
			}
			if be32(hdr[4:]) >= 3 && (len(hdr) < qcow2IncompatOffset+8 || be64(hdr[qcow2IncompatOffset:])&qcow2DataFileBit != 0) {
				t.Fatalf("%s taken as qcow2 with an external data file or no feature bits", name)
			}
		default:
			t.Fatalf("unknown format %q", format)
		}
	})
}

// qcow2Header is the first 104 bytes of a qcow2 image of version, with a
// backing file offset and incompatible features.
func qcow2Header(version uint32, backing, incompat uint64) []byte {
	h := make([]byte, qcow2V3HeaderLen)
	copy(h, qcow2Magic)
	putBE(h[4:8], uint64(version))
	putBE(h[qcow2BackingOffset:qcow2BackingOffset+8], backing)
	putBE(h[qcow2IncompatOffset:qcow2IncompatOffset+8], incompat)
	return h
}

func putBE(b []byte, v uint64) {
	for i := len(b) - 1; i >= 0; i-- {
		b[i], v = byte(v), v>>8
	}
}

func be64(b []byte) uint64 {
	var v uint64
	for _, c := range b[:8] {
		v = v<<8 | uint64(c)
	}
	return v
}

func be32(b []byte) uint32 { return uint32(be64(append(b[:4:4], 0, 0, 0, 0)) >> 32) }

// renderValidated counts fuzz inputs rendered, to send every
// renderSchemaEvery-th to virt-xml-validate (about 50 ms each).
var renderValidated atomic.Int64

const renderSchemaEvery = 200

// FuzzRender builds specs from fuzzed fields (every string that reaches the
// domain XML: names, paths, command line, metadata, serials, tags) and
// renders them. Run it with
//
//	go test -run='^$' -fuzz=FuzzRender -fuzztime=30s ./vm/
//
// Properties: no panic; Render refuses or its output parses back into the
// very domain it built (nothing added, lost or replaced: no markup from a
// field, no character the XML cannot carry silently swapped); the output
// passes libvirt's schema (virt-xml-validate): every seed and corpus entry
// in a plain `go test`, every 200th input while fuzzing.
// The seed corpus is below and in testdata/fuzz/FuzzRender.
func FuzzRender(f *testing.F) {
	f.Add("kvm-default-vm1-0123456789ab", []byte("0123456789abcdef"), uint8(2), uint16(512), uint8(0),
		"/var/lib/x/overlay.qcow2", "console=ttyS0 quiet", "web", "prod", "/var/lib/x/vms/a", "vol-1", "/data")
	f.Add("a</name><evil/>", []byte{0xff, 0xee}, uint8(1), uint16(64), uint8(0xff),
		"/k\"'&<>", "a\x01b]]>", "p&q", "<ns>", "/s", "x\x00", "/d/../e")
	f.Add("\xff\xfe", []byte{}, uint8(0), uint16(0), uint8(0x0a), "", "\t\r\n", "\U0010ffff", "\ufffe", "", "", "")
	f.Fuzz(func(t *testing.T, name string, id []byte, vcpus uint8, memMiB uint16, flags uint8,
		path, cmdline, podName, podNamespace, stateDir, serial, volume string) {
		s := fuzzSpec(name, id, vcpus, memMiB, flags, path, cmdline, podName, podNamespace, stateDir, serial, volume)
		out, err := Render(s)
		if err != nil {
			return
		}
		built, err := buildDomain(s)
		if err != nil {
			t.Fatal(err)
		}
		var back libvirtxml.Domain
		if err := back.Unmarshal(string(out)); err != nil {
			t.Fatalf("output does not parse: %v\n%s", err, out)
		}
		clearXMLNames(reflect.ValueOf(built))
		clearXMLNames(reflect.ValueOf(&back))
		if !reflect.DeepEqual(*built, back) {
			t.Fatalf("output does not parse back to the domain built:\nbuilt %+v\nback  %+v\n%s", *built, back, out)
		}
		// The metadata is inner XML to libvirtxml: parse it as well.
		var meta vmMetaXML
		if err := xml.Unmarshal([]byte(back.Metadata.XML), &meta); err != nil {
			t.Fatalf("metadata does not parse: %v\n%s", err, out)
		}
		if meta.Metadata != s.Meta {
			t.Fatalf("metadata does not parse back to the spec's:\nspec %+v\nback %+v\n%s", s.Meta, meta.Metadata, out)
		}
		if fuzzing() && renderValidated.Add(1)%renderSchemaEvery != 0 {
			return
		}
		validateSchema(t, out)
	})
}

// clearXMLNames zeroes every xml.Name below v: Unmarshal records the
// element names that a built domain leaves empty.
func clearXMLNames(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			clearXMLNames(v.Elem())
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			clearXMLNames(v.Index(i))
		}
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[xml.Name]() {
			v.Set(reflect.Zero(v.Type()))
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				clearXMLNames(v.Field(i))
			}
		}
	}
}

// fuzzSpec builds a spec from fuzzed fields; flags choose the variants.
func fuzzSpec(name string, id []byte, vcpus uint8, memMiB uint16, flags uint8,
	path, cmdline, podName, podNamespace, stateDir, serial, volume string) *Spec {
	var u [16]byte
	copy(u[:], id)
	s := &Spec{
		Name:      name,
		UUID:      fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16]),
		VCPUs:     int(vcpus),
		MemoryMiB: int(memMiB),
		Accel:     AccelTCG,
		Emulator:  "/usr/bin/qemu-system-x86_64",
		Machine:   "q35",
		Console:   Console{Socket: stateDir + "/console.sock", Log: stateDir + "/console.log"},
		Meta: Metadata{
			SandboxID: podName, ContainerID: name, Namespace: podNamespace, PodUID: serial,
			PodName: podName, PodNamespace: podNamespace, ContainerName: volume, StateDir: stateDir,
		},
	}
	if flags&1 != 0 {
		s.Accel = AccelKVM
	}
	if flags&2 != 0 {
		s.Kernel = &Kernel{Path: path, Initrd: path + ".initrd", Cmdline: cmdline}
	} else {
		s.Disk = &Disk{Path: path, Format: "qcow2"}
	}
	if flags&4 != 0 {
		s.ConfigDrive = &ConfigDrive{Path: stateDir + "/config.img", Format: "vfat"}
	}
	if flags&8 != 0 {
		s.VolumeDisks = []VolumeDisk{{Name: volume, Path: path + ".vol", Format: "raw", Serial: serial, ReadOnly: flags&16 != 0}}
	}
	if flags&32 != 0 {
		s.Shares = []Share{{Name: volume, Source: stateDir, Tag: serial}}
		s.VirtiofsBinary = "/usr/lib/qemu/virtiofsd"
	}
	if flags&64 != 0 {
		s.MaxVCPUs = s.VCPUs + 2
	}
	if flags&128 != 0 {
		s.Pinning = &Pinning{CPUSet: []int{0, 1}, EmulatorCPUs: []int{0}, MemoryNodes: []int{0}}
	}
	return s
}

func fuzzing() bool {
	fl := flag.Lookup("test.fuzz")
	return fl != nil && fl.Value.String() != ""
}

// validateSchema runs libvirt's schema check on a rendered domain; it
// skips where virt-xml-validate or xmllint is missing.
func validateSchema(t *testing.T, out []byte) {
	t.Helper()
	validator, err := exec.LookPath("virt-xml-validate")
	if err != nil {
		t.Skip("virt-xml-validate not installed (package libvirt-clients)")
	}
	if _, err := exec.LookPath("xmllint"); err != nil {
		t.Skip("xmllint, which virt-xml-validate runs, not installed (package libxml2-utils)")
	}
	f := filepath.Join(t.TempDir(), "domain.xml")
	if err := os.WriteFile(f, out, 0o644); err != nil {
		t.Fatal(err)
	}
	if msg, err := exec.Command(validator, f, "domain").CombinedOutput(); err != nil {
		t.Fatalf("output does not pass libvirt's schema: %v\n%s\n%s", err, msg, out)
	}
}
