package shim

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
)

var safeSegment = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// pathSegment returns s when it is a safe single path element, else a hash
// of it, so nothing a pod chooses can steer a path.
func pathSegment(s string) string {
	if safeSegment.MatchString(s) && s != "." && s != ".." {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	return "h-" + hex.EncodeToString(sum[:16])
}

// layout places everything under the state dir:
//
//	vms/<domain>/                  per-VM runtime files, removed on delete
//	pods/<pod uid>/sandboxes/<id>  one marker per live sandbox of the pod
//	pods/<pod uid>/<container>/    per-pod VM data (the disk overlay)
type layout struct{ root string }

func (l layout) vmDir(domain string) string { return filepath.Join(l.root, "vms", domain) }

// ensure creates the state dir's top levels searchable by the QEMU user
// (o+x, not listable), whichever task comes first.
func (l layout) ensure() error {
	return searchableDirs(l.root, filepath.Join(l.root, "vms"), filepath.Join(l.root, "pods"))
}

// ensurePodVMDir creates the dir of a pod's VM data, on the QEMU user's
// path to the disk overlay.
func (l layout) ensurePodVMDir(podUID, containerName string) error {
	return searchableDirs(l.podDir(podUID), l.podVMDir(podUID, containerName))
}

// searchableDirs creates each dir (in order) with mode 0711, also when it
// was made earlier with another mode.
func searchableDirs(dirs ...string) error {
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return fmt.Errorf("create state dir: %w", err)
		}
		if err := os.Chmod(d, 0o711); err != nil {
			return fmt.Errorf("create state dir: %w", err)
		}
	}
	return nil
}

func (l layout) podDir(podUID string) string {
	return filepath.Join(l.root, "pods", pathSegment(podUID))
}

func (l layout) sandboxMarker(podUID, sandboxID string) string {
	return filepath.Join(l.podDir(podUID), "sandboxes", pathSegment(sandboxID))
}

func (l layout) podVMDir(podUID, containerName string) string {
	return filepath.Join(l.podDir(podUID), pathSegment(containerName))
}
