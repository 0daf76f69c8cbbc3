//go:build e2e

package e2e

// The objects the tests apply, as Go values that encoding/json turns into
// the manifests a user would write.

import (
	"fmt"

	"github.com/kvm-shim/containerd-shim-kvm-v1/shim"
)

type obj = map[string]any

// runtimeClass is the RuntimeClass docs/install.md gives, with the
// memory overhead the shim asks for (a VM pod without it is refused at
// StartContainer: its pod's limit cannot hold QEMU beside the guest) but
// without its kvm.containerd.io/vcpu slot: this suite's node is set up by
// hand, not by the installer, and advertises no slots (TestCapacity
// covers them).
func runtimeClass() obj {
	return obj{
		"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
		"metadata": obj{"name": "kvm"},
		"handler":  "kvm",
		"overhead": obj{"podFixed": obj{"memory": fmt.Sprintf("%dMi", shim.PodFixedOverheadMiB)}},
	}
}

// podOpts describe a pod of the tests: one container called "main" for a
// runc pod, "vm" for a VM pod.
type podOpts struct {
	name  string
	image string
	vm    bool // runtimeClassName kvm
	stdin bool // for kubectl attach -i
	probe int  // tcpSocket readiness probe port; 0 for none
	// execProbe is an exec readiness probe's command (run in the guest
	// through the QEMU guest agent); nil for none.
	execProbe []string
	labels    obj    // pod labels; app=<name> when nil
	grace     int    // terminationGracePeriodSeconds; 0 means 30
	memory    string // memory limit; "" means 256Mi
	// volumes are the pod's volumes; mounts and devices the container's
	// volumeMounts and volumeDevices.
	volumes, mounts, devices []obj
	annotations              obj    // pod annotations
	restartPolicy            string // "" means Always
}

func (o podOpts) container() string {
	if o.vm {
		return "vm"
	}
	return "main"
}

// podSpec is the pod's spec: bound to the node (there is no scheduler),
// no service account token, no service links, the host's DNS.
func podSpec(o podOpts) obj {
	if o.grace == 0 {
		o.grace = 30
	}
	if o.memory == "" {
		o.memory = "256Mi"
	}
	c := obj{
		"name":            o.container(),
		"image":           o.image,
		"imagePullPolicy": "Never",
		"stdin":           o.stdin,
		// The node has 2 CPUs: a pod whose requests do not fit stays
		// Pending. Request little, limit one CPU.
		"resources": obj{
			"requests": obj{"cpu": "50m", "memory": o.memory},
			"limits":   obj{"cpu": "1", "memory": o.memory},
		},
	}
	if o.probe != 0 {
		c["readinessProbe"] = obj{
			"tcpSocket":     obj{"port": o.probe},
			"periodSeconds": 1, "timeoutSeconds": 1, "failureThreshold": 1,
		}
	}
	if o.execProbe != nil {
		// Under TCG one exec through the agent takes 0.1 to 0.4 s.
		c["readinessProbe"] = obj{
			"exec":          obj{"command": o.execProbe},
			"periodSeconds": 1, "timeoutSeconds": 5, "failureThreshold": 1,
		}
	}
	spec := obj{
		"automountServiceAccountToken":  false,
		"enableServiceLinks":            false,
		"dnsPolicy":                     "Default",
		"terminationGracePeriodSeconds": o.grace,
		"containers":                    []obj{c},
	}
	if o.vm {
		spec["runtimeClassName"] = "kvm"
	}
	if o.restartPolicy != "" {
		spec["restartPolicy"] = o.restartPolicy
	}
	if o.volumes != nil {
		spec["volumes"] = o.volumes
	}
	if o.mounts != nil {
		c["volumeMounts"] = o.mounts
	}
	if o.devices != nil {
		c["volumeDevices"] = o.devices
	}
	return spec
}

func (o podOpts) podLabels() obj {
	if o.labels != nil {
		return o.labels
	}
	return obj{"app": o.name}
}

func pod(o podOpts) obj {
	meta := obj{"name": o.name, "namespace": "default", "labels": o.podLabels()}
	if o.annotations != nil {
		meta["annotations"] = o.annotations
	}
	return obj{"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": podSpec(o)}
}

func deployment(name string, replicas int, o podOpts) obj {
	return obj{
		"apiVersion": "apps/v1", "kind": "Deployment",
		"metadata": obj{"name": name, "namespace": "default"},
		"spec": obj{
			"replicas": replicas,
			"selector": obj{"matchLabels": o.podLabels()},
			"template": obj{"metadata": obj{"labels": o.podLabels()}, "spec": podSpec(o)},
		},
	}
}

func service(name string, selector obj, port, targetPort int) obj {
	return obj{
		"apiVersion": "v1", "kind": "Service",
		"metadata": obj{"name": name, "namespace": "default"},
		"spec": obj{
			"type":     "ClusterIP",
			"selector": selector,
			"ports":    []obj{{"port": port, "targetPort": targetPort, "protocol": "TCP"}},
		},
	}
}
