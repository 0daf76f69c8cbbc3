package shim

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// vmIdentity says which VM a container is. For a CRI pod it is the pod uid
// and the container's name, so a restarted container (a new container id)
// finds the same domain name, uuid and disk; for a plain containerd
// container it is the namespace and container id.
type vmIdentity struct {
	Namespace     string
	ContainerID   string
	SandboxID     string
	PodUID        string
	PodName       string
	PodNamespace  string
	ContainerName string
}

func (v vmIdentity) inPod() bool { return v.PodUID != "" && v.ContainerName != "" }

// name is what the guest is called: the pod's name, else the container id.
func (v vmIdentity) name() string {
	if v.PodName != "" {
		return v.PodName
	}
	return v.ContainerID
}

func (v vmIdentity) key() string {
	if v.inPod() {
		return "pod/" + v.PodUID + "/" + v.ContainerName
	}
	return "ctr/" + v.Namespace + "/" + v.ContainerID
}

// runtimeKey names the per-container runtime dir. Unlike the domain name
// it differs between restarts of a container, so the cleanup of an old
// container never touches the files of its successor.
func (v vmIdentity) runtimeKey() string {
	sum := sha256.Sum256([]byte("ctr/" + v.Namespace + "/" + v.ContainerID))
	return hex.EncodeToString(sum[:6])
}

var unsafeName = regexp.MustCompile(`[^a-z0-9.-]+`)

func namePart(s string, maxLen int) string {
	s = strings.Trim(unsafeName.ReplaceAllString(strings.ToLower(s), "-"), "-.")
	if len(s) > maxLen {
		s = strings.Trim(s[:maxLen], "-.")
	}
	if s == "" {
		s = "x"
	}
	return s
}

// DomainName is deterministic and readable: kvm-<pod namespace or
// containerd namespace>-<container name or id>-<12 hex of the identity>.
func (v vmIdentity) DomainName() string {
	sum := sha256.Sum256([]byte(v.key()))
	scope, name := v.Namespace, v.ContainerID
	if v.inPod() {
		scope, name = v.PodNamespace, v.ContainerName
	}
	return fmt.Sprintf("kvm-%s-%s-%s", namePart(scope, 20), namePart(name, 24), hex.EncodeToString(sum[:6]))
}

// UUID is a name-based (version 5 style) uuid of the identity, stable
// across restarts of the container.
func (v vmIdentity) UUID() string {
	sum := sha256.Sum256([]byte("uuid/" + v.key()))
	sum[6] = sum[6]&0x0f | 0x50
	sum[8] = sum[8]&0x3f | 0x80
	h := hex.EncodeToString(sum[:16])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

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
