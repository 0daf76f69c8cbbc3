package vmplan

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
	"github.com/kvm-shim/containerd-shim-kvm-v1/configdrive"
)

// DiskImageName is KubeVirt's convention: a filesystem volume whose root
// holds this file is the VM's disk, not a directory to share.
const DiskImageName = "disk.img"

// plumbing is what happens to CRI's own mounts, which are not volumes:
// the guest has its own files and kernel file systems.
var plumbing = map[string]string{
	"/etc/hosts":           "the guest keeps its own /etc/hosts",
	"/etc/hostname":        "the guest's hostname comes from the config drive",
	"/etc/resolv.conf":     "the guest's DNS servers come from the config drive (or ip= for direct boot)",
	"/dev/shm":             "the guest has its own /dev/shm",
	"/dev/termination-log": "a VM writes no termination message; kubelet finds it empty",
}

// terminationMessage matches the file kubelet mounts at a container's
// terminationMessagePath when the pod sets another path than
// /dev/termination-log: <kubelet root>/pods/<uid>/containers/<name>/<id>.
var terminationMessage = regexp.MustCompile(`/pods/[^/]+/containers/[^/]+/[^/]+$`)

// VolumeKind is what the OCI spec says a volume is; the shim looks
// at the host to decide what the guest gets.
type VolumeKind int

// The kinds of volume.
const (
	VolDevice VolumeKind = iota // linux.devices entry of type b: a raw block volume
	VolBind                     // bind mount: a block device, a directory with disk.img, or a share
)

// Volume is one pod volume as the OCI spec gives it.
type Volume struct {
	Kind         VolumeKind
	Dest         string // container path: the volume's name in messages
	Source       string // host path of a bind mount
	Major, Minor int64  // of a device
	ReadOnly     bool
}

// ClassifyVolumes reads the volumes out of the container's OCI spec:
// linux.devices of type b and every bind mount that is not CRI plumbing.
// Kernel file systems (proc, sysfs, tmpfs, devpts, mqueue, cgroup) and
// plumbing mounts are left out and listed in skipped, each with why, for
// the caller's log; a device the guest cannot get (character devices) is
// an error naming it.
func ClassifyVolumes(spec *specs.Spec) (vols []Volume, skipped []string, err error) {
	seen := map[string]bool{}
	if spec.Linux != nil {
		for _, d := range spec.Linux.Devices {
			if d.Type != "b" {
				return nil, nil, fmt.Errorf("device %s (type %s, %d:%d): only block devices can be given to a VM: %w", d.Path, d.Type, d.Major, d.Minor,
					errdefs.ErrInvalidArgument)
			}
			if err := configdrive.CheckVolumePath(d.Path); err != nil {
				return nil, nil, err
			}
			vols = append(vols, Volume{Kind: VolDevice, Dest: d.Path, Major: d.Major, Minor: d.Minor, ReadOnly: !deviceWritable(spec, d)})
			seen[d.Path] = true
		}
	}
	for _, m := range spec.Mounts {
		bind := m.Type == "bind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind")
		switch why, ok := plumbing[m.Destination]; {
		case !bind:
			skipped = append(skipped, m.Destination+" ("+m.Type+": the guest has its own)")
			continue
		case ok:
			skipped = append(skipped, m.Destination+" ("+why+")")
			continue
		case terminationMessage.MatchString(m.Source):
			skipped = append(skipped, m.Destination+" ("+plumbing["/dev/termination-log"]+")")
			continue
		case seen[m.Destination]:
			continue // the node of a raw block device, already a device
		}
		if err := configdrive.CheckVolumePath(m.Destination); err != nil {
			return nil, nil, err
		}
		vols = append(vols, Volume{Kind: VolBind, Dest: m.Destination, Source: m.Source, ReadOnly: slices.Contains(m.Options, "ro")})
		seen[m.Destination] = true
	}
	return vols, skipped, nil
}

// deviceWritable reads the cgroup rule CRI wrote for the device: the last
// rule that matches decides, and none matching leaves it writable.
func deviceWritable(spec *specs.Spec, d specs.LinuxDevice) bool {
	w := true
	if spec.Linux.Resources == nil {
		return w
	}
	for _, r := range spec.Linux.Resources.Devices {
		if !r.Allow || (r.Type != "" && r.Type != "a" && r.Type != d.Type) ||
			(r.Major != nil && *r.Major != d.Major) || (r.Minor != nil && *r.Minor != d.Minor) {
			continue
		}
		w = strings.Contains(r.Access, "w")
	}
	return w
}

// DiskImageSizes reads annotations.DiskImages.
func DiskImageSizes(spec *specs.Spec) (map[string]int64, error) {
	v, ok := spec.Annotations[annotations.DiskImages]
	if !ok {
		return nil, nil
	}
	sizes := map[string]int64{}
	for _, e := range strings.Split(v, ",") {
		p, size, ok := strings.Cut(strings.TrimSpace(e), "=")
		if !ok || !strings.HasPrefix(p, "/") {
			return nil, fmt.Errorf("annotation %s = %q: entry %q: want <container path>=<size>: %w", annotations.DiskImages, v, e,
				errdefs.ErrInvalidArgument)
		}
		b, err := ParseSize(size)
		if err != nil {
			return nil, fmt.Errorf("annotation %s: Volume %s: %v: %w", annotations.DiskImages, p, err, errdefs.ErrInvalidArgument)
		}
		sizes[filepath.Clean(p)] = b
	}
	return sizes, nil
}

// GuestNames gives each volume the name the guest finds it by (a
// virtio-blk serial, or a virtiofs tag) of at most maxLen characters: the
// container path without its leading slash, other slashes as '-' and any
// character outside [A-Za-z0-9_.+-] as '_' ("/etc/app" is "etc-app",
// "/dev/xvda" is "dev-xvda"). A name longer than maxLen, or one two volumes
// would share ("/a-b" and "/a/b"), is its first maxLen-9 characters, '-' and
// the first 8 hex digits of the SHA-256 of the container path.
func GuestNames(vols []Volume, maxLen int) []string {
	names := make([]string, len(vols))
	count := map[string]int{}
	for i, v := range vols {
		names[i] = plainName(v.Dest)
		count[names[i]]++
	}
	for i, v := range vols {
		if n := names[i]; len(n) > maxLen || count[n] > 1 {
			sum := sha256.Sum256([]byte(v.Dest))
			names[i] = n[:min(len(n), maxLen-9)] + "-" + hex.EncodeToString(sum[:4])
		}
	}
	return names
}

// plainName is dest as a guest name before the length and clash checks.
func plainName(dest string) string {
	p := strings.Trim(filepath.Clean(dest), "/")
	if p == "" {
		return "root"
	}
	return strings.Map(func(r rune) rune {
		switch {
		case r == '/':
			return '-'
		case r < 0x80 && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_.+-", r)):
			return r
		}
		return '_'
	}, p)
}
