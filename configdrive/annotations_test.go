package configdrive

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
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
		{name: "format annotation wins", ann: map[string]string{AnnotationFormat: " vfat "}, def: FormatISO9660,
			check: func(t *testing.T, o Options) {
				if o.Format != FormatVFAT {
					t.Errorf("format = %q", o.Format)
				}
			}},
		{name: "unknown format", ann: map[string]string{AnnotationFormat: "ext4"}, wantErr: AnnotationFormat},
		{name: "upper case format", ann: map[string]string{AnnotationFormat: "VFAT"}, wantErr: AnnotationFormat},
		{name: "bad default format", def: Format("ntfs"), wantErr: `default config drive format "ntfs"`},
		{name: "disabled", ann: map[string]string{AnnotationEnabled: "false"}, check: func(t *testing.T, o Options) {
			if !o.Disabled {
				t.Error("not disabled")
			}
		}},
		{name: "enabled", ann: map[string]string{AnnotationEnabled: "true"}, check: func(t *testing.T, o Options) {
			if o.Disabled {
				t.Error("disabled")
			}
		}},
		{name: "enabled not a bool", ann: map[string]string{AnnotationEnabled: "maybe"}, wantErr: AnnotationEnabled},
		{name: "plain user-data", ann: map[string]string{AnnotationUserData: "#cloud-config\nhostname: x\n"},
			check: func(t *testing.T, o Options) {
				if string(o.UserData) != "#cloud-config\nhostname: x\n" {
					t.Errorf("user-data = %q", o.UserData)
				}
			}},
		{name: "plain user-data at the limit", ann: map[string]string{AnnotationUserData: atLimit}, check: func(t *testing.T, o Options) {
			if len(o.UserData) != MaxUserData {
				t.Errorf("user-data is %d bytes", len(o.UserData))
			}
		}},
		{name: "plain user-data over the limit", ann: map[string]string{AnnotationUserData: overLimit}, wantErr: AnnotationUserData +
			": user-data is 65537 bytes"},
		{name: "base64 user-data", ann: map[string]string{AnnotationUserDataBase64: base64.StdEncoding.EncodeToString([]byte("\x00binary\xff"))},
			check: func(t *testing.T, o Options) {
				if string(o.UserData) != "\x00binary\xff" {
					t.Errorf("user-data = %q", o.UserData)
				}
			}},
		{name: "base64 user-data wrapped and unpadded", ann: map[string]string{AnnotationUserDataBase64: "aGVs\nbG8\n"},
			check: func(t *testing.T, o Options) {
				if string(o.UserData) != "hello" {
					t.Errorf("user-data = %q", o.UserData)
				}
			}},
		{name: "base64 user-data at the limit",
			ann: map[string]string{AnnotationUserDataBase64: base64.StdEncoding.EncodeToString([]byte(atLimit))}, check: func(t *testing.T,
				o Options) {
				if len(o.UserData) != MaxUserData {
					t.Errorf("user-data is %d bytes", len(o.UserData))
				}
			}},
		{name: "base64 user-data over the limit",
			ann:     map[string]string{AnnotationUserDataBase64: base64.StdEncoding.EncodeToString([]byte(overLimit))},
			wantErr: AnnotationUserDataBase64},
		{name: "base64 user-data far over the limit", ann: map[string]string{AnnotationUserDataBase64: strings.Repeat("QUFB", 1<<20)},
			wantErr: AnnotationUserDataBase64},
		{name: "bad base64", ann: map[string]string{AnnotationUserDataBase64: "not base64!"}, wantErr: AnnotationUserDataBase64 +
			": not valid base64"},
		{name: "both user-data forms", ann: map[string]string{AnnotationUserData: "a", AnnotationUserDataBase64: "YQ=="}, wantErr: "not both"},
		{name: "empty plain with base64", ann: map[string]string{AnnotationUserData: "", AnnotationUserDataBase64: "YQ=="},
			check: func(t *testing.T, o Options) {
				if string(o.UserData) != "a" {
					t.Errorf("user-data = %q", o.UserData)
				}
			}},
		{name: "keys",
			ann: map[string]string{AnnotationSSHKeys: "# team keys\r\n" + testKeyEd25519 + "\r\n\n" + testKeyRSA + "\n" + testKeyRSA +
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
		{name: "key name collides with key-N", ann: map[string]string{AnnotationSSHKeys: testKeyRSA + " key-2\n" + testKeyRSA},
			check: func(t *testing.T, o Options) {
				if len(o.PublicKeys) != 2 {
					t.Errorf("keys = %v, want 2", o.PublicKeys)
				}
			}},
		{name: "bad key", ann: map[string]string{AnnotationSSHKeys: testKeyEd25519 + "\nssh-rsa AAAAnotakey user"}, wantErr: AnnotationSSHKeys +
			": line 2: not an OpenSSH public key"},
		{name: "truncated key", ann: map[string]string{AnnotationSSHKeys: testKeyEd25519[:60]}, wantErr: AnnotationSSHKeys},
		{name: "private key", ann: map[string]string{AnnotationSSHKeys: "-----BEGIN OPENSSH PRIVATE KEY-----"}, wantErr: AnnotationSSHKeys},
		{name: "key with options", ann: map[string]string{AnnotationSSHKeys: `command="/bin/sh -c 'rm -rf /'" ` + testKeyEd25519},
			wantErr: "options are not supported"},
		{name: "key with control characters", ann: map[string]string{AnnotationSSHKeys: testKeyEd25519 + "\x1b[31m"},
			wantErr: "control characters"},
		{name: "too many keys", ann: map[string]string{AnnotationSSHKeys: manyKeys}, wantErr: "more than 128 keys"},
		{name: "only comments", ann: map[string]string{AnnotationSSHKeys: "# nothing\n\n"}, check: func(t *testing.T, o Options) {
			if o.PublicKeys != nil {
				t.Errorf("keys = %v", o.PublicKeys)
			}
		}},
		{name: "metadata", ann: map[string]string{AnnotationMetadata: `{"a": "1", "b": "", "ü": "ß"}`}, check: func(t *testing.T, o Options) {
			if len(o.Meta) != 3 || o.Meta["a"] != "1" || o.Meta["ü"] != "ß" {
				t.Errorf("meta = %v", o.Meta)
			}
		}},
		{name: "metadata not an object", ann: map[string]string{AnnotationMetadata: `["a"]`}, wantErr: AnnotationMetadata +
			": not a JSON object"},
		{name: "metadata null", ann: map[string]string{AnnotationMetadata: `null`}, wantErr: AnnotationMetadata},
		{name: "metadata string", ann: map[string]string{AnnotationMetadata: `"a"`}, wantErr: AnnotationMetadata},
		{name: "metadata number value", ann: map[string]string{AnnotationMetadata: `{"a": 1}`}, wantErr: `value of "a" is not a string`},
		{name: "metadata nested", ann: map[string]string{AnnotationMetadata: `{"a": {"b": "c"}}`}, wantErr: AnnotationMetadata},
		{name: "metadata trailing data", ann: map[string]string{AnnotationMetadata: `{"a": "b"} {}`}, wantErr: "data after the object"},
		{name: "metadata broken", ann: map[string]string{AnnotationMetadata: `{"a": `}, wantErr: AnnotationMetadata},
		{name: "metadata empty key", ann: map[string]string{AnnotationMetadata: `{"": "x"}`}, wantErr: "empty key"},
		{name: "metadata long value", ann: map[string]string{AnnotationMetadata: `{"a": "` + strings.Repeat("v", 256) + `"}`},
			wantErr: "more than the limit of 255"},
		{name: "metadata too many", ann: map[string]string{AnnotationMetadata: bigMeta}, wantErr: "more than the limit of 128"},
		{name: "metadata blank", ann: map[string]string{AnnotationMetadata: "  "}, check: func(t *testing.T, o Options) {
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
				if !strings.Contains(err.Error(), AnnotationPrefix) && tc.def == "" {
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
