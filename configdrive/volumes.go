package configdrive

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"

	"github.com/containerd/errdefs"
)

// Volume is one pod volume as the guest gets it, listed on the drive so
// the guest can put it at its container path.
type Volume struct {
	// Kind is VolumeShare (a virtiofs tag) or VolumeDisk (a virtio-blk
	// serial, the disk is /dev/disk/by-id/virtio-<Name>).
	Kind     string
	Name     string // the tag or serial: [A-Za-z0-9_.+-]
	Path     string // container path, absolute, one line
	ReadOnly bool
}

// Volume kinds.
const (
	VolumeShare = "share"
	VolumeDisk  = "disk"
)

// VolumesFile is the drive's list of volumes, one line each:
//
//	<kind> <name> <ro|rw> <container path to the end of the line>
//
// A guest with only a POSIX shell reads it with `while read -r kind name
// mode path`.
const VolumesFile = "kvm/volumes"

func (v Volume) validate() error {
	if v.Kind != VolumeShare && v.Kind != VolumeDisk {
		return fmt.Errorf("volume %s: unknown kind %q: %w", v.Path, v.Kind, errdefs.ErrInvalidArgument)
	}
	if v.Name == "" || strings.IndexFunc(v.Name, func(r rune) bool {
		return !(r < unicode.MaxASCII && (unicode.IsLetter(r) || unicode.IsDigit(r) || strings.ContainsRune("_.+-", r)))
	}) >= 0 {
		return fmt.Errorf("volume %s: name %q is not [A-Za-z0-9_.+-]: %w", v.Path, v.Name, errdefs.ErrInvalidArgument)
	}
	return CheckVolumePath(v.Path)
}

// CheckVolumePath refuses a container path the drive cannot list: not
// absolute, or with a control character (a line break would start a
// forged entry).
func CheckVolumePath(p string) error {
	if !strings.HasPrefix(p, "/") || strings.IndexFunc(p, unicode.IsControl) >= 0 {
		return fmt.Errorf("volume %q: a container path must be absolute and free of control characters: %w", p, errdefs.ErrInvalidArgument)
	}
	return nil
}

// renderVolumes returns the volume list, and the vendor-data with which
// cloud-init mounts each share at its container path at every boot
// (bootcmd runs early, before user-data's own commands; commands given as
// lists are quoted by cloud-init, never split by a shell). Disks are left
// to the guest: it finds each by serial.
func renderVolumes(vols []Volume) (list, vendorData []byte, err error) {
	var b strings.Builder
	var bootcmd [][]string
	for _, v := range vols {
		if err := v.validate(); err != nil {
			return nil, nil, err
		}
		mode := "rw"
		if v.ReadOnly {
			mode = "ro"
		}
		fmt.Fprintf(&b, "%s %s %s %s\n", v.Kind, v.Name, mode, v.Path)
		if v.Kind == VolumeShare {
			bootcmd = append(bootcmd,
				[]string{"mkdir", "-p", v.Path},
				[]string{"mount", "-t", "virtiofs", "-o", mode, v.Name, v.Path})
		}
	}
	vendorData = []byte("{}\n")
	if len(bootcmd) > 0 {
		// JSON is YAML: cloud-config built without string templating.
		cc, err := json.Marshal(map[string]any{"bootcmd": bootcmd})
		if err != nil {
			return nil, nil, err
		}
		if vendorData, err = json.Marshal(map[string]string{"cloud-init": "#cloud-config\n" + string(cc) + "\n"}); err != nil {
			return nil, nil, err
		}
		vendorData = append(vendorData, '\n')
	}
	return []byte(b.String()), vendorData, nil
}
