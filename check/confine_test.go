package check

import (
	"os"
	"strings"
	"testing"

	"github.com/kvm-shim/containerd-shim-kvm-v1/hostid"
)

func confineResult(rs []checkResult, name string) []checkResult {
	var out []checkResult
	for _, r := range rs {
		if r.name == name {
			out = append(out, r)
		}
	}
	return out
}

func TestConfinementChecks(t *testing.T) {
	r, _ := hostid.ParseRange("1000000000-1000000099")
	base := confineHost{passwd: []byte("root:x:0:0::/root:/bin/sh\nlibvirt-qemu:x:64055:108::/:/bin/false\n"), group: []byte("root:x:0:\n")}

	rs := confinementChecks(base, &r, 3)
	for _, name := range []string{"seccomp", "namespaces", "device ACL", "lsm", "identities"} {
		got := confineResult(rs, name)
		if len(got) != 1 || got[0].level != checkOK {
			t.Errorf("defaults: %s = %+v, want one ok", name, got)
		}
	}
	if id := confineResult(rs, "identities"); len(id) == 1 && !strings.Contains(id[0].note, "100 ids, 3 in use") {
		t.Errorf("identities note %q lacks the range's use", id[0].note)
	}

	weak := base
	weak.qemuConf = []byte("seccomp_sandbox = 0\nnamespaces = [ ]\ncgroup_controllers = [ \"cpuset\" ]\nuser = " +
		"\"root\"\n#seccomp_sandbox = 1\n")
	weak.lsm = "capability,apparmor"
	weak.passwd = append(weak.passwd, []byte("clash:x:1000000042:100::/:/bin/false\n")...)
	weak.domainDirs = map[string]os.FileMode{"/var/lib/libvirt/qemu": 0o750}
	rs = confinementChecks(weak, &r, 0)
	for name, want := range map[string]checkLevel{"seccomp": checkWarn, "namespaces": checkWarn, "device ACL": checkWarn,
		"qemu user": checkWarn, "lsm": checkOK} {
		if got := confineResult(rs, name); len(got) != 1 || got[0].level != want {
			t.Errorf("weak host: %s = %+v, want %s", name, got, want)
		}
	}
	ids := confineResult(rs, "identities")
	if len(ids) != 2 || ids[0].level != checkFail || !strings.Contains(ids[0].note, "user clash (1000000042)") || ids[1].level != checkWarn {
		t.Errorf("weak host identities = %+v, want a clash failure and a domain dir warning", ids)
	}

	off := confinementChecks(base, nil, 0)
	if got := confineResult(off, "identities"); len(got) != 1 || got[0].level != checkWarn {
		t.Errorf("identities off = %+v, want a warning", got)
	}
	noChown := base
	noChown.qemuConf = []byte("dynamic_ownership = 0\n")
	if got := confineResult(confinementChecks(noChown, &r, 0), "identities"); len(got) != 1 || got[0].level != checkFail {
		t.Errorf("dynamic_ownership 0 = %+v, want a failure", got)
	}
}
