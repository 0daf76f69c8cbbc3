package shim

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// FuzzReadRecord feeds arbitrary bytes to the task record reader, which
// the cleanup `delete` of a dead shim trusts to find what to undo. Run it
// with
//
//	go test -run='^$' -fuzz=FuzzReadRecord -fuzztime=30s ./shim/
//
// Properties: no panic; an unreadable record is an error naming the file;
// a record that reads is written back and reads again to the same record
// (nothing the reader accepts is lost or changed by the writer).
// The seed corpus is below and in testdata/fuzz/FuzzReadRecord.
func FuzzReadRecord(f *testing.F) {
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"kind":"vm","id":"c1","namespace":"k8s.io","stateDir":"/var/lib/x","libvirtSocket":"/run/libvirt/libvirt-sock","pid":42,` +
		`"domain":"kvm-k8s.io-c1-0123","vmDir":"/var/lib/x/vms/kvm-k8s.io-c1-0123",` +
		`"overlay":"/var/lib/x/pods/u/overlay.qcow2","keepOverlay":true,` +
		`"numaOwner":"kvm-k8s.io-c1-0123","numaStore":"/run/x/numa.json",` +
		`"network":{"netns":"/var/run/netns/cni-1","links":[{"podIf":"eth0","tap":"tap0","createdQdisc":true}]},` +
		`"cgroup":"/kubepods/pod1/c1","cgroupCreated":true,"podUID":"u"}`))
	f.Add([]byte(`{"kind":"sandbox","id":"sb","podNetwork":{},"network":{"netns":"/n","podIf":"eth0","tap":"t","createdQdisc":true}}`))
	f.Add([]byte(`{"kind":"vm","id":"\u0000","pid":-1,"network":null}`))
	f.Add([]byte(`{"kind":1}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"id":"a","id":"b"}`))
	f.Add([]byte("\xff\xfe{"))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, recordFile), data, 0o600); err != nil {
			t.Fatal(err)
		}
		r, err := readRecord(dir)
		if err != nil {
			if !strings.Contains(err.Error(), filepath.Join(dir, recordFile)) {
				t.Fatalf("error does not name the record: %v", err)
			}
			return
		}
		if r == nil {
			t.Fatal("an existing record read as none")
		}
		if err = writeRecord(dir, r); err != nil {
			t.Fatalf("write back: %v", err)
		}
		back, err := readRecord(dir)
		if err != nil {
			t.Fatalf("read back: %v", err)
		}
		if !reflect.DeepEqual(r, back) {
			t.Fatalf("record changed by a write and read:\n%#v\n%#v", r, back)
		}
	})
}
