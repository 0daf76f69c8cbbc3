package configdrive

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/containerd/errdefs"
	"golang.org/x/crypto/ssh"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
)

// Limits enforced by FromAnnotations and Build.
const (
	MaxUserData      = 64 << 10 // bytes of user-data (decoded)
	MaxKeys          = 128      // SSH public keys
	MaxKeysText      = 64 << 10 // bytes of the ssh-authorized-keys annotation
	MaxMetaEntries   = 128      // entries in meta (nova's default quota)
	MaxMetaKeyLen    = 255      // bytes of a meta key (nova's limit)
	MaxMetaValueLen  = 255      // bytes of a meta value (nova's limit)
	maxMetadataInput = 256 << 10
)

// Format is the file system of the config drive.
type Format string

const (
	// FormatVFAT is a FAT file system, what Windows guests need and the default.
	FormatVFAT Format = "vfat"
	// FormatISO9660 is an ISO 9660 image with Rock Ridge and Joliet.
	FormatISO9660 Format = "iso9660"
)

// ParseFormat returns the Format named s; "" gives FormatVFAT. Other
// values are an error wrapping errdefs.ErrInvalidArgument.
func ParseFormat(s string) (Format, error) {
	switch Format(s) {
	case "":
		return FormatVFAT, nil
	case FormatVFAT, FormatISO9660:
		return Format(s), nil
	}
	return "", fmt.Errorf("config drive format %q is not %q or %q: %w",
		s, FormatVFAT, FormatISO9660, errdefs.ErrInvalidArgument)
}

// Options is what the pod's user chose for the config drive.
type Options struct {
	// Disabled means no config drive at all (annotation config-drive=false).
	Disabled bool
	// Format of the image; "" means FormatVFAT.
	Format Format
	// UserData is written to openstack/*/user_data when not empty.
	UserData []byte
	// PublicKeys maps a key name to one OpenSSH public key line
	// ("type base64 [comment]"); it becomes meta_data.json "public_keys".
	PublicKeys map[string]string
	// Meta is meta_data.json "meta": user metadata and whatever pod labels
	// or annotations the caller chooses to expose.
	Meta map[string]string
}

// FromAnnotations reads Options from pod annotations (keys under
// annotations.Prefix; other keys are ignored). defaultFormat applies when the
// format annotation is absent or empty. Every error wraps
// errdefs.ErrInvalidArgument and names the annotation.
func FromAnnotations(ann map[string]string, defaultFormat Format) (Options, error) {
	var o Options
	var err error

	if v, ok := ann[annotations.ConfigDrive]; ok {
		enabled, perr := strconv.ParseBool(strings.TrimSpace(v))
		if perr != nil {
			return Options{}, annotationError(annotations.ConfigDrive, "%q is not true or false", v)
		}
		o.Disabled = !enabled
	}

	if format := strings.TrimSpace(ann[annotations.ConfigDriveFormat]); format != "" {
		if o.Format, err = ParseFormat(format); err != nil {
			return Options{}, annotationError(annotations.ConfigDriveFormat, "%q is not %q or %q", format, FormatVFAT, FormatISO9660)
		}
	} else if o.Format, err = ParseFormat(string(defaultFormat)); err != nil {
		return Options{}, fmt.Errorf("default %w", err)
	}

	if o.UserData, err = userDataFrom(ann); err != nil {
		return Options{}, err
	}

	if v := ann[annotations.SSHAuthorizedKeys]; v != "" {
		if o.PublicKeys, err = ParseAuthorizedKeys(v); err != nil {
			return Options{}, fmt.Errorf("annotation %s: %w", annotations.SSHAuthorizedKeys, err)
		}
	}

	if v, ok := ann[annotations.Metadata]; ok && strings.TrimSpace(v) != "" {
		if o.Meta, err = parseMeta(v); err != nil {
			return Options{}, fmt.Errorf("annotation %s: %w", annotations.Metadata, err)
		}
	}
	return o, nil
}

func annotationError(key, format string, args ...any) error {
	return fmt.Errorf("annotation %s: %s: %w", key, fmt.Sprintf(format, args...), errdefs.ErrInvalidArgument)
}

func userDataFrom(ann map[string]string) ([]byte, error) {
	plain, hasPlain := ann[annotations.UserData]
	b64, hasB64 := ann[annotations.UserDataBase64]
	if hasPlain && hasB64 && plain != "" && b64 != "" {
		return nil, annotationError(annotations.UserDataBase64, "give user-data either as %s or as %s, not both",
			annotations.UserData, annotations.UserDataBase64)
	}
	if plain != "" {
		if len(plain) > MaxUserData {
			return nil, annotationError(annotations.UserData, "user-data is %d bytes, more than the limit of %d",
				len(plain), MaxUserData)
		}
		return []byte(plain), nil
	}
	if b64 == "" {
		return nil, nil
	}
	// Refuse before decoding what cannot fit (4 characters per 3 bytes).
	compact := strings.Map(func(r rune) rune {
		if unicode.IsSpace(r) {
			return -1
		}
		return r
	}, b64)
	if len(compact) > (MaxUserData+2)/3*4 {
		return nil, annotationError(annotations.UserDataBase64, "user-data is more than the limit of %d bytes", MaxUserData)
	}
	enc := base64.StdEncoding
	if len(compact)%4 != 0 {
		enc = base64.RawStdEncoding
	}
	data, err := enc.Strict().DecodeString(compact)
	if err != nil {
		return nil, annotationError(annotations.UserDataBase64, "not valid base64: %v", err)
	}
	if len(data) > MaxUserData {
		return nil, annotationError(annotations.UserDataBase64, "user-data is %d bytes, more than the limit of %d",
			len(data), MaxUserData)
	}
	if len(data) == 0 {
		return nil, nil
	}
	return data, nil
}

// ParseAuthorizedKeys parses newline-separated OpenSSH public keys
// ("type base64 [comment]"; blank lines and lines starting with # are
// skipped) into the name → key map of Options.PublicKeys. A key's name is
// the first word of its comment, or "key-N" for the N-th key (from 1) when
// it has no comment or the name is taken. Lines with authorized_keys options
// (command="...", from=...) are refused: the drive carries public keys, and
// cloudbase-init writes them as they are.
func ParseAuthorizedKeys(text string) (map[string]string, error) {
	if len(text) > MaxKeysText {
		return nil, fmt.Errorf("%d bytes, more than the limit of %d: %w", len(text), MaxKeysText, errdefs.ErrInvalidArgument)
	}
	keys := map[string]string{}
	n := 0
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		n++
		if n > MaxKeys {
			return nil, fmt.Errorf("more than %d keys: %w", MaxKeys, errdefs.ErrInvalidArgument)
		}
		key, name, err := parseKeyLine(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", i+1, err)
		}
		if _, taken := keys[name]; name == "" || taken {
			name = fmt.Sprintf("key-%d", n)
		}
		for _, taken := keys[name]; taken; _, taken = keys[name] {
			name += "_"
		}
		keys[name] = key
	}
	if len(keys) == 0 {
		return nil, nil
	}
	return keys, nil
}

// parseKeyLine checks one public key line and returns it normalised
// ("type base64[ comment]") with the name its comment gives.
func parseKeyLine(line string) (key, name string, err error) {
	if !utf8.ValidString(line) {
		return "", "", fmt.Errorf("not valid UTF-8: %w", errdefs.ErrInvalidArgument)
	}
	pub, comment, options, rest, err := ssh.ParseAuthorizedKey([]byte(line))
	if err != nil {
		return "", "", fmt.Errorf("not an OpenSSH public key (%v): %w", err, errdefs.ErrInvalidArgument)
	}
	if len(options) > 0 || len(bytes.TrimSpace(rest)) > 0 {
		return "", "", fmt.Errorf("authorized_keys options are not supported, give the bare key: %w", errdefs.ErrInvalidArgument)
	}
	for _, r := range comment {
		if unicode.IsControl(r) && r != '\t' {
			return "", "", fmt.Errorf("key comment has control characters: %w", errdefs.ErrInvalidArgument)
		}
	}
	key = strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub)))
	comment = strings.TrimSpace(comment)
	if comment != "" {
		key += " " + comment
		name = strings.Fields(comment)[0]
	}
	return key, name, nil
}

// parseMeta decodes a JSON object of strings and checks nova's limits.
func parseMeta(v string) (map[string]string, error) {
	if len(v) > maxMetadataInput {
		return nil, fmt.Errorf("%d bytes, more than the limit of %d: %w", len(v), maxMetadataInput, errdefs.ErrInvalidArgument)
	}
	dec := json.NewDecoder(strings.NewReader(v))
	var raw map[string]json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("not a JSON object of strings (%v): %w", err, errdefs.ErrInvalidArgument)
	}
	if raw == nil { // "null"
		return nil, fmt.Errorf("not a JSON object of strings (null): %w", errdefs.ErrInvalidArgument)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("not a JSON object of strings (data after the object): %w", errdefs.ErrInvalidArgument)
	}
	meta := make(map[string]string, len(raw))
	for k, rv := range raw {
		var s string
		if err := json.Unmarshal(rv, &s); err != nil {
			return nil, fmt.Errorf("value of %q is not a string: %w", k, errdefs.ErrInvalidArgument)
		}
		meta[k] = s
	}
	if err := checkMeta(meta); err != nil {
		return nil, err
	}
	return meta, nil
}

// checkMeta enforces nova's metadata limits.
func checkMeta(meta map[string]string) error {
	if len(meta) > MaxMetaEntries {
		return fmt.Errorf("%d entries, more than the limit of %d: %w", len(meta), MaxMetaEntries, errdefs.ErrInvalidArgument)
	}
	for k, v := range meta {
		if k == "" {
			return fmt.Errorf("empty key: %w", errdefs.ErrInvalidArgument)
		}
		if len(k) > MaxMetaKeyLen {
			return fmt.Errorf("key %.20q... is %d bytes, more than the limit of %d: %w", k, len(k), MaxMetaKeyLen, errdefs.ErrInvalidArgument)
		}
		if len(v) > MaxMetaValueLen {
			return fmt.Errorf("value of %q is %d bytes, more than the limit of %d: %w", k, len(v), MaxMetaValueLen, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// Validate checks o against the limits FromAnnotations enforces, for
// Options built by hand. Errors wrap errdefs.ErrInvalidArgument.
func (o Options) Validate() error {
	if _, err := ParseFormat(string(o.Format)); err != nil {
		return err
	}
	if len(o.UserData) > MaxUserData {
		return fmt.Errorf("user-data is %d bytes, more than the limit of %d: %w", len(o.UserData), MaxUserData, errdefs.ErrInvalidArgument)
	}
	if len(o.PublicKeys) > MaxKeys {
		return fmt.Errorf("%d SSH keys, more than the limit of %d: %w", len(o.PublicKeys), MaxKeys, errdefs.ErrInvalidArgument)
	}
	for name, key := range o.PublicKeys {
		if strings.ContainsAny(key, "\r\n") {
			return fmt.Errorf("SSH key %q: more than one line: %w", name, errdefs.ErrInvalidArgument)
		}
		if _, _, err := parseKeyLine(key); err != nil {
			return fmt.Errorf("SSH key %q: %w", name, err)
		}
	}
	if err := checkMeta(o.Meta); err != nil {
		return fmt.Errorf("meta: %w", err)
	}
	return nil
}
