package vmplan

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
)

// Identity says which VM a container is. For a CRI pod it is the pod uid
// and the container's name, so a restarted container (a new container id)
// finds the same domain name, uuid and disk; for a plain containerd
// container it is the namespace and container id.
type Identity struct {
	Namespace     string
	ContainerID   string
	SandboxID     string
	PodUID        string
	PodName       string
	PodNamespace  string
	ContainerName string
}

// InPod reports whether the container is a CRI pod's: its VM is named by
// the pod and the container's name.
func (v Identity) InPod() bool { return v.PodUID != "" && v.ContainerName != "" }

// Name is what the guest is called: the pod's name, else the container id.
func (v Identity) Name() string {
	if v.PodName != "" {
		return v.PodName
	}
	return v.ContainerID
}

// key is what the name and uuid are derived from.
func (v Identity) key() string {
	if v.InPod() {
		return "pod/" + v.PodUID + "/" + v.ContainerName
	}
	return "ctr/" + v.Namespace + "/" + v.ContainerID
}

// RuntimeKey names the per-container runtime dir. Unlike the domain name
// it differs between restarts of a container, so the cleanup of an old
// container never touches the files of its successor.
func (v Identity) RuntimeKey() string {
	sum := sha256.Sum256([]byte("ctr/" + v.Namespace + "/" + v.ContainerID))
	return hex.EncodeToString(sum[:6])
}

// unsafeName is what a domain name part may not hold.
var unsafeName = regexp.MustCompile(`[^a-z0-9.-]+`)

// namePart is s made safe for a domain name, at most maxLen long.
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
func (v Identity) DomainName() string {
	sum := sha256.Sum256([]byte(v.key()))
	scope, name := v.Namespace, v.ContainerID
	if v.InPod() {
		scope, name = v.PodNamespace, v.ContainerName
	}
	return fmt.Sprintf("kvm-%s-%s-%s", namePart(scope, 20), namePart(name, 24), hex.EncodeToString(sum[:6]))
}

// UUID is a name-based (version 5 style) uuid of the identity, stable
// across restarts of the container.
func (v Identity) UUID() string {
	sum := sha256.Sum256([]byte("uuid/" + v.key()))
	sum[6] = sum[6]&0x0f | 0x50
	sum[8] = sum[8]&0x3f | 0x80
	h := hex.EncodeToString(sum[:16])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}
