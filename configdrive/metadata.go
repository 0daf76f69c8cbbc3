package configdrive

import (
	"crypto/sha1"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/containerd/errdefs"
)

// Instance is what the shim knows of the VM.
type Instance struct {
	// UUID is meta_data.json "uuid", cloud-init's instance-id: a new value
	// makes cloud-init treat the VM as a new instance. Use StableUUID.
	UUID string
	// Hostname is meta_data.json "hostname"; "" means SanitizeHostname(Name).
	// When set it must be an RFC 1123 host name (dotted labels allowed).
	Hostname string
	// Name is meta_data.json "name" (the pod name).
	Name string
	// AvailabilityZone is meta_data.json "availability_zone" (omitted when "").
	AvailabilityZone string
	// InstanceType is meta_data.json "instance_type" (omitted when "").
	InstanceType string
	// LaunchIndex is meta_data.json "launch_index".
	LaunchIndex int
	// Volumes are the pod's volumes (VolumesFile); shares are also
	// mounted by cloud-init through vendor_data.json.
	Volumes []Volume
}

// uuidNamespace is the name-based UUID namespace of StableUUID.
var uuidNamespace = [16]byte{0x6b, 0x76, 0x6d, 0x2d, 0x73, 0x68, 0x69, 0x6d, 0x2d, 0x63, 0x6f, 0x6e, 0x66, 0x69, 0x67, 0x32}

// StableUUID returns the instance uuid for a pod's container: a name-based
// (version 5, SHA-1) UUID of pod uid and container name, so the same pod
// uid and container always get the same uuid. It is a good libvirt domain
// <uuid> too (nova uses one uuid for both, and guests may compare them).
func StableUUID(podUID, container string) string {
	return uuidV5(uuidNamespace, podUID+"/"+container)
}

func uuidV5(ns [16]byte, name string) string {
	h := sha1.New()
	h.Write(ns[:])
	h.Write([]byte(name))
	var u [16]byte
	copy(u[:], h.Sum(nil))
	u[6] = u[6]&0x0f | 0x50
	u[8] = u[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// SanitizeHostname turns a pod name (an RFC 1123 subdomain, or anything)
// into an RFC 1123 label: lower case letters, digits and '-', starting and
// ending with a letter or digit, at most 63 bytes. Other characters
// (dots included) become '-', runs of '-' collapse. It never returns "":
// a name with nothing usable gives "vm".
func SanitizeHostname(podName string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(podName) {
		if b.Len() > 63 {
			break
		}
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
			dash = false
		default:
			if !dash && b.Len() > 0 {
				b.WriteByte('-')
				dash = true
			}
		}
	}
	s := b.String()
	if len(s) > 63 {
		s = s[:63]
	}
	s = strings.TrimRight(s, "-")
	if s == "" {
		return "vm"
	}
	return s
}

// validHostname reports whether h is an RFC 1123 host name: dot-separated
// labels of letters, digits and '-', not starting or ending with '-', each
// at most 63 bytes, at most 253 in all.
func validHostname(h string) bool {
	if len(h) == 0 || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if len(label) == 0 || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}

// metaData is meta_data.json as nova writes it (the keys guests read).
type metaData struct {
	UUID             string            `json:"uuid"`
	Name             string            `json:"name"`
	Hostname         string            `json:"hostname"`
	LaunchIndex      int               `json:"launch_index"`
	AvailabilityZone string            `json:"availability_zone,omitempty"`
	InstanceType     string            `json:"instance_type,omitempty"`
	PublicKeys       map[string]string `json:"public_keys,omitempty"`
	Keys             []metaKey         `json:"keys,omitempty"`
	Meta             map[string]string `json:"meta"`
	RandomSeed       []byte            `json:"random_seed,omitempty"` // base64 in JSON, as nova writes it
}

// metaKey is an entry of nova's "keys" list.
type metaKey struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Data string `json:"data"`
}

// renderMetaData returns meta_data.json. seed may be nil (no random_seed).
func renderMetaData(inst Instance, opts Options, seed []byte) ([]byte, error) {
	if strings.TrimSpace(inst.UUID) == "" {
		return nil, fmt.Errorf("instance uuid is empty: %w", errdefs.ErrInvalidArgument)
	}
	host := inst.Hostname
	if host == "" {
		host = SanitizeHostname(inst.Name)
	} else if !validHostname(host) {
		return nil, fmt.Errorf("hostname %q is not an RFC 1123 host name: %w", host, errdefs.ErrInvalidArgument)
	}
	md := metaData{
		UUID:             inst.UUID,
		Name:             inst.Name,
		Hostname:         host,
		LaunchIndex:      inst.LaunchIndex,
		AvailabilityZone: inst.AvailabilityZone,
		InstanceType:     inst.InstanceType,
		Meta:             opts.Meta,
		RandomSeed:       seed,
	}
	if md.Meta == nil {
		md.Meta = map[string]string{}
	}
	if len(opts.PublicKeys) > 0 {
		md.PublicKeys = opts.PublicKeys
		names := make([]string, 0, len(opts.PublicKeys))
		for n := range opts.PublicKeys {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			md.Keys = append(md.Keys, metaKey{Name: n, Type: "ssh", Data: opts.PublicKeys[n]})
		}
	}
	return marshal(md)
}

// marshal is json.MarshalIndent with a final newline and no HTML escaping.
func marshal(v any) ([]byte, error) {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return []byte(b.String()), nil
}
