package configdrive

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"golang.org/x/crypto/ssh"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
)

// FuzzAnnotations drives the annotation → meta_data.json path with
// arbitrary annotation values. Run it with
//
//	go test -fuzz=FuzzAnnotations -fuzztime=30s ./configdrive/
//
// Properties: no panic; an error is InvalidArgument and names an
// annotation; without an error every limit holds, every key parses as an
// SSH public key, and the rendered meta_data.json and network_data.json are
// valid JSON that give back the same keys, meta and user-data.
// The seed corpus is below and in testdata/fuzz/FuzzAnnotations.
func FuzzAnnotations(f *testing.F) {
	f.Add("", "", "", "", "", "")
	f.Add("#cloud-config\nhostname: a\n", "", testKeyEd25519, `{"a":"b"}`, "vfat", "true")
	f.Add("", base64.StdEncoding.EncodeToString([]byte("#!/bin/sh\necho hi\n")), testKeyRSA+"\n"+testKeyEd25519, `{"k":"v","x":""}`, "iso9660",
		"")
	f.Add("x", "YQ==", "# c\n\n"+testKeyEd25519+" key-1\n"+testKeyRSA, `[]`, "ntfs", "maybe")
	f.Add("", "aGVs\nbG8", `command="x" `+testKeyEd25519, `{"a":1}`, " vfat ", "0")
	f.Add(strings.Repeat("u", MaxUserData), "", testKeyEd25519+" \xff\xfe", `{"\u00fc":"\ud800"}`, "", "false")
	f.Add("", strings.Repeat("QUFB", MaxUserData/3+1), "ssh-ed25519 AAAA", `null`, "", "")
	f.Fuzz(func(t *testing.T, userData, userDataB64, keys, metadata, format, enabled string) {
		ann := map[string]string{}
		for k, v := range map[string]string{
			annotations.UserData: userData, annotations.UserDataBase64: userDataB64, annotations.SSHAuthorizedKeys: keys,
			annotations.Metadata: metadata, annotations.ConfigDriveFormat: format, annotations.ConfigDrive: enabled,
		} {
			if v != "" {
				ann[k] = v
			}
		}
		o, err := FromAnnotations(ann, FormatVFAT)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("error is not InvalidArgument: %v", err)
			}
			if !strings.Contains(err.Error(), "annotation "+annotations.Prefix) {
				t.Fatalf("error does not name an annotation: %v", err)
			}
			return
		}
		if err = o.Validate(); err != nil {
			t.Fatalf("accepted options do not validate: %v", err)
		}
		if len(o.UserData) > MaxUserData {
			t.Fatalf("user-data is %d bytes", len(o.UserData))
		}
		if len(o.PublicKeys) > MaxKeys || len(o.Meta) > MaxMetaEntries {
			t.Fatalf("%d keys, %d meta entries", len(o.PublicKeys), len(o.Meta))
		}
		for name, k := range o.PublicKeys {
			if _, _, opts, rest, parseAuthorizedKeyErr := ssh.ParseAuthorizedKey([]byte(k)); parseAuthorizedKeyErr != nil || len(opts) > 0 ||
				len(rest) > 0 || strings.ContainsAny(k, "\r\n") {
				t.Fatalf("key %q = %q does not parse as one public key: %v", name, k, parseAuthorizedKeyErr)
			}
		}
		for k, v := range o.Meta {
			if k == "" || len(k) > MaxMetaKeyLen || len(v) > MaxMetaValueLen {
				t.Fatalf("meta entry %q=%q breaks the limits", k, v)
			}
		}

		files, err := render(Instance{UUID: "fuzz", Name: userData}, nil, o, []byte(keys))
		if err != nil {
			t.Fatalf("render: %v", err)
		}
		for _, fl := range files {
			switch {
			case strings.HasSuffix(fl.path, ".json"):
				if !json.Valid(fl.data) {
					t.Fatalf("%s is not valid JSON:\n%s", fl.path, fl.data)
				}
			case strings.HasSuffix(fl.path, "/user_data"):
				if string(fl.data) != string(o.UserData) {
					t.Fatalf("user_data differs from the options")
				}
			}
		}
		var md struct {
			Hostname   string            `json:"hostname"`
			PublicKeys map[string]string `json:"public_keys"`
			Meta       map[string]string `json:"meta"`
		}
		if err := json.Unmarshal(files[0].data, &md); err != nil {
			t.Fatal(err)
		}
		if !isRFC1123Label(md.Hostname) {
			t.Fatalf("hostname %q is not an RFC 1123 label", md.Hostname)
		}
		if len(md.PublicKeys) != len(o.PublicKeys) || len(md.Meta) != len(o.Meta) {
			t.Fatalf("meta_data.json has %d keys and %d meta, options %d and %d", len(md.PublicKeys), len(md.Meta), len(o.PublicKeys), len(o.Meta))
		}
		for k, v := range o.Meta {
			if md.Meta[k] != v {
				t.Fatalf("meta %q: %q in meta_data.json, %q in options", k, md.Meta[k], v)
			}
		}
		for k, v := range o.PublicKeys {
			if md.PublicKeys[k] != v {
				t.Fatalf("key %q: %q in meta_data.json, %q in options", k, md.PublicKeys[k], v)
			}
		}
	})
}

// FuzzSanitizeHostname: any input gives an RFC 1123 label.
func FuzzSanitizeHostname(f *testing.F) {
	for _, s := range []string{"", "web-0", "Web.Example.COM", "-a-", strings.Repeat("a-", 40), "\xff", "äb"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if h := SanitizeHostname(s); !isRFC1123Label(h) {
			t.Fatalf("SanitizeHostname(%q) = %q", s, h)
		}
	})
}
