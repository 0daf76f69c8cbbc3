package configdrive

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
)

func TestFromAnnotations(t *testing.T) {
	atLimit := strings.Repeat("x", MaxUserData)
	overLimit := atLimit + "x"
	manyKeys := strings.Repeat(testKeyEd25519+"\n", MaxKeys+1)
	bigMeta := "{"
	for i := 0; i <= MaxMetaEntries; i++ {
		if i > 0 {
			bigMeta += ","
		}
		bigMeta += fmt.Sprintf(`"k%d":"v"`, i)
	}
	bigMeta += "}"

	for _, tc := range []struct {
		name    string
		ann     map[string]string
		def     Format
		wantErr string // substring; "" means no error
		check   func(t *testing.T, o Options)
	}{
		{name: "nothing", ann: nil, check: func(t *testing.T, o Options) {
			if o.Format != FormatVFAT || o.Disabled || o.UserData != nil || o.PublicKeys != nil || o.Meta != nil {
				t.Errorf("options = %+v, want defaults", o)
			}
		}},
		{name: "other annotations ignored", ann: map[string]string{"kvm.containerd.io/numa-node": "1", "user-data": "x"}},
		{name: "default format from config", ann: nil, def: FormatISO9660, check: func(t *testing.T, o Options) {
			if o.Format != FormatISO9660 {
				t.Errorf("format = %q", o.Format)
			}
		}},
		{name: "format annotation wins", ann: map[string]string{annotations.ConfigDriveFormat: " vfat "}, def: FormatISO9660,
			check: func(t *testing.T, o Options) {
				if o.Format != FormatVFAT {
					t.Errorf("format = %q", o.Format)
				}
			}},
		{name: "unknown format", ann: map[string]string{annotations.ConfigDriveFormat: "ext4"}, wantErr: annotations.ConfigDriveFormat},
		{name: "upper case format", ann: map[string]string{annotations.ConfigDriveFormat: "VFAT"}, wantErr: annotations.ConfigDriveFormat},
		{name: "bad default format", def: Format("ntfs"), wantErr: `default config drive format "ntfs"`},
		{name: "disabled", ann: map[string]string{annotations.ConfigDrive: "false"}, check: func(t *testing.T, o Options) {
			if !o.Disabled {
				t.Error("not disabled")
			}
		}},
		{name: "enabled", ann: map[string]string{annotations.ConfigDrive: "true"}, check: func(t *testing.T, o Options) {
			if o.Disabled {
				t.Error("disabled")
			}
		}},
		{name: "enabled not a bool", ann: map[string]string{annotations.ConfigDrive: "maybe"}, wantErr: annotations.ConfigDrive},
		{name: "plain user-data", ann: map[string]string{annotations.UserData: "#cloud-config\nhostname: x\n"},
			check: func(t *testing.T, o Options) {
				if string(o.UserData) != "#cloud-config\nhostname: x\n" {
					t.Errorf("user-data = %q", o.UserData)
				}
			}},
		{name: "plain user-data at the limit", ann: map[string]string{annotations.UserData: atLimit}, check: func(t *testing.T, o Options) {
			if len(o.UserData) != MaxUserData {
				t.Errorf("user-data is %d bytes", len(o.UserData))
			}
		}},
		{name: "plain user-data over the limit", ann: map[string]string{annotations.UserData: overLimit}, wantErr: annotations.UserData +
			": user-data is 65537 bytes"},
		{name: "base64 user-data",
			ann: map[string]string{annotations.UserDataBase64: base64.StdEncoding.EncodeToString([]byte("\x00binary\xff"))},
			check: func(t *testing.T, o Options) {
				if string(o.UserData) != "\x00binary\xff" {
					t.Errorf("user-data = %q", o.UserData)
				}
			}},
		{name: "base64 user-data wrapped and unpadded", ann: map[string]string{annotations.UserDataBase64: "aGVs\nbG8\n"},
			check: func(t *testing.T, o Options) {
				if string(o.UserData) != "hello" {
					t.Errorf("user-data = %q", o.UserData)
				}
			}},
		{name: "base64 user-data at the limit",
			ann: map[string]string{annotations.UserDataBase64: base64.StdEncoding.EncodeToString([]byte(atLimit))}, check: func(t *testing.T,
				o Options) {
				if len(o.UserData) != MaxUserData {
					t.Errorf("user-data is %d bytes", len(o.UserData))
				}
			}},
		{name: "base64 user-data over the limit",
			ann:     map[string]string{annotations.UserDataBase64: base64.StdEncoding.EncodeToString([]byte(overLimit))},
			wantErr: annotations.UserDataBase64},
		{name: "base64 user-data far over the limit", ann: map[string]string{annotations.UserDataBase64: strings.Repeat("QUFB", 1<<20)},
			wantErr: annotations.UserDataBase64},
		{name: "bad base64", ann: map[string]string{annotations.UserDataBase64: "not base64!"}, wantErr: annotations.UserDataBase64 +
			": not valid base64"},
		{name: "both user-data forms", ann: map[string]string{annotations.UserData: "a", annotations.UserDataBase64: "YQ=="},
			wantErr: "not both"},
		{name: "empty plain with base64", ann: map[string]string{annotations.UserData: "", annotations.UserDataBase64: "YQ=="},
			check: func(t *testing.T, o Options) {
				if string(o.UserData) != "a" {
					t.Errorf("user-data = %q", o.UserData)
				}
			}},
		{name: "keys",
			ann: map[string]string{annotations.SSHAuthorizedKeys: "# team keys\r\n" + testKeyEd25519 + "\r\n\n" + testKeyRSA + "\n" + testKeyRSA +
				" alice@example\n"},
			check: func(t *testing.T, o Options) {
				want := map[string]string{
					"alice@example": testKeyEd25519,
					"key-2":         testKeyRSA,
					"key-3":         testKeyRSA + " alice@example",
				}
				if fmt.Sprint(o.PublicKeys) != fmt.Sprint(want) {
					t.Errorf("keys = %v\nwant %v", o.PublicKeys, want)
				}
			}},
		{name: "key name collides with key-N", ann: map[string]string{annotations.SSHAuthorizedKeys: testKeyRSA + " key-2\n" + testKeyRSA},
			check: func(t *testing.T, o Options) {
				if len(o.PublicKeys) != 2 {
					t.Errorf("keys = %v, want 2", o.PublicKeys)
				}
			}},
		{name: "bad key", ann: map[string]string{annotations.SSHAuthorizedKeys: testKeyEd25519 + "\nssh-rsa AAAAnotakey user"},
			wantErr: annotations.SSHAuthorizedKeys +
				": line 2: not an OpenSSH public key"},
		{name: "truncated key", ann: map[string]string{annotations.SSHAuthorizedKeys: testKeyEd25519[:60]},
			wantErr: annotations.SSHAuthorizedKeys},
		{name: "private key", ann: map[string]string{annotations.SSHAuthorizedKeys: "-----BEGIN OPENSSH PRIVATE KEY-----"},
			wantErr: annotations.SSHAuthorizedKeys},
		{name: "key with options", ann: map[string]string{annotations.SSHAuthorizedKeys: `command="/bin/sh -c 'rm -rf /'" ` + testKeyEd25519},
			wantErr: "options are not supported"},
		{name: "key with control characters", ann: map[string]string{annotations.SSHAuthorizedKeys: testKeyEd25519 + "\x1b[31m"},
			wantErr: "control characters"},
		{name: "too many keys", ann: map[string]string{annotations.SSHAuthorizedKeys: manyKeys}, wantErr: "more than 128 keys"},
		{name: "only comments", ann: map[string]string{annotations.SSHAuthorizedKeys: "# nothing\n\n"}, check: func(t *testing.T, o Options) {
			if o.PublicKeys != nil {
				t.Errorf("keys = %v", o.PublicKeys)
			}
		}},
		{name: "metadata", ann: map[string]string{annotations.Metadata: `{"a": "1", "b": "", "ü": "ß"}`}, check: func(t *testing.T, o Options) {
			if len(o.Meta) != 3 || o.Meta["a"] != "1" || o.Meta["ü"] != "ß" {
				t.Errorf("meta = %v", o.Meta)
			}
		}},
		{name: "metadata not an object", ann: map[string]string{annotations.Metadata: `["a"]`}, wantErr: annotations.Metadata +
			": not a JSON object"},
		{name: "metadata null", ann: map[string]string{annotations.Metadata: `null`}, wantErr: annotations.Metadata},
		{name: "metadata string", ann: map[string]string{annotations.Metadata: `"a"`}, wantErr: annotations.Metadata},
		{name: "metadata number value", ann: map[string]string{annotations.Metadata: `{"a": 1}`}, wantErr: `value of "a" is not a string`},
		{name: "metadata nested", ann: map[string]string{annotations.Metadata: `{"a": {"b": "c"}}`}, wantErr: annotations.Metadata},
		{name: "metadata trailing data", ann: map[string]string{annotations.Metadata: `{"a": "b"} {}`}, wantErr: "data after the object"},
		{name: "metadata broken", ann: map[string]string{annotations.Metadata: `{"a": `}, wantErr: annotations.Metadata},
		{name: "metadata empty key", ann: map[string]string{annotations.Metadata: `{"": "x"}`}, wantErr: "empty key"},
		{name: "metadata long value", ann: map[string]string{annotations.Metadata: `{"a": "` + strings.Repeat("v", 256) + `"}`},
			wantErr: "more than the limit of 255"},
		{name: "metadata too many", ann: map[string]string{annotations.Metadata: bigMeta}, wantErr: "more than the limit of 128"},
		{name: "metadata blank", ann: map[string]string{annotations.Metadata: "  "}, check: func(t *testing.T, o Options) {
			if o.Meta != nil {
				t.Errorf("meta = %v", o.Meta)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := FromAnnotations(tc.ann, tc.def)
			if tc.wantErr != "" {
				if err == nil {
					t.Fatalf("no error, want one containing %q", tc.wantErr)
				}
				if !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Errorf("error %q is not InvalidArgument", err)
				}
				if !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("error %q does not contain %q", err, tc.wantErr)
				}
				if !strings.Contains(err.Error(), annotations.Prefix) && tc.def == "" {
					t.Errorf("error %q does not name the annotation", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := o.Validate(); err != nil {
				t.Errorf("FromAnnotations result does not validate: %v", err)
			}
			if tc.check != nil {
				tc.check(t, o)
			}
		})
	}
}

func TestOptionsValidate(t *testing.T) {
	for name, o := range map[string]Options{
		"format":        {Format: "ntfs"},
		"user-data":     {UserData: make([]byte, MaxUserData+1)},
		"key":           {PublicKeys: map[string]string{"a": "ssh-ed25519 AAAA"}},
		"two key lines": {PublicKeys: map[string]string{"a": testKeyEd25519 + "\n" + testKeyRSA}},
		"meta":          {Meta: map[string]string{"k": strings.Repeat("v", 300)}},
	} {
		if err := o.Validate(); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: Validate() = %v, want InvalidArgument", name, err)
		}
	}
	if err := (Options{}).Validate(); err != nil {
		t.Errorf("zero Options: %v", err)
	}
}
