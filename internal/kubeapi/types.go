package kubeapi

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// ObjectMeta is the part of an object's metadata the installer reads.
type ObjectMeta struct {
	Name        string            `json:"name"`
	Namespace   string            `json:"namespace,omitempty"`
	UID         string            `json:"uid,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Node is a node, with the fields the installer reads.
type Node struct {
	Metadata ObjectMeta `json:"metadata"`
	Status   struct {
		NodeInfo struct {
			// ContainerRuntimeVersion is kubelet's report of the CRI
			// runtime: "containerd://1.6.20".
			ContainerRuntimeVersion string `json:"containerRuntimeVersion"`
		} `json:"nodeInfo"`
	} `json:"status"`
}

// Pod is a pod, with the fields the installer reads.
type Pod struct {
	Metadata ObjectMeta `json:"metadata"`
	Spec     struct {
		NodeName         string `json:"nodeName"`
		RuntimeClassName string `json:"runtimeClassName"`
	} `json:"spec"`
	Status struct {
		Phase string `json:"phase"`
	} `json:"status"`
}

// ObjectReference names the object an event is about.
type ObjectReference struct {
	Kind       string `json:"kind"`
	APIVersion string `json:"apiVersion,omitempty"`
	Name       string `json:"name"`
	UID        string `json:"uid,omitempty"`
}

// EventSource is who reports an event.
type EventSource struct {
	Component string `json:"component"`
	Host      string `json:"host,omitempty"`
}

// Event is a core/v1 event.
type Event struct {
	APIVersion     string          `json:"apiVersion"`
	Kind           string          `json:"kind"`
	Metadata       ObjectMeta      `json:"metadata"`
	InvolvedObject ObjectReference `json:"involvedObject"`
	Reason         string          `json:"reason"`
	Message        string          `json:"message"`
	Type           string          `json:"type"`
	Source         EventSource     `json:"source"`
	FirstTimestamp time.Time       `json:"firstTimestamp"`
	LastTimestamp  time.Time       `json:"lastTimestamp"`
	Count          int             `json:"count"`
}

// GetNode reads a node.
func (c *Client) GetNode(ctx context.Context, name string) (*Node, error) {
	var n Node
	err := c.do(ctx, request{method: http.MethodGet, path: "/api/v1/nodes/" + url.PathEscape(name), out: &n})
	if err != nil {
		return nil, err
	}
	return &n, nil
}

// SetNodeLabel sets (value non-nil) or removes (nil) one label of a node
// with a JSON merge patch, which touches no other label.
func (c *Client) SetNodeLabel(ctx context.Context, node, key string, value *string) error {
	patch := map[string]any{"metadata": map[string]any{"labels": map[string]any{key: value}}}
	return c.do(ctx, request{
		method: http.MethodPatch, path: "/api/v1/nodes/" + url.PathEscape(node),
		contentType: "application/merge-patch+json", body: patch,
	})
}

// PodsOnNode lists the pods bound to a node, in every namespace.
func (c *Client) PodsOnNode(ctx context.Context, node string) ([]Pod, error) {
	var list struct {
		Items []Pod `json:"items"`
	}
	q := url.Values{"fieldSelector": {"spec.nodeName=" + node}}
	if err := c.do(ctx, request{method: http.MethodGet, path: "/api/v1/pods", query: q, out: &list}); err != nil {
		return nil, err
	}
	return list.Items, nil
}

// CreateEvent records an event in namespace ns.
func (c *Client) CreateEvent(ctx context.Context, ns string, e *Event) error {
	e.APIVersion, e.Kind = "v1", "Event"
	return c.do(ctx, request{
		method: http.MethodPost, path: "/api/v1/namespaces/" + url.PathEscape(ns) + "/events",
		contentType: "application/json", body: e,
	})
}

// SetNodeExtendedResource sets (value non-nil) or removes (nil) one
// extended resource in a node's status, capacity and allocatable both,
// with a JSON merge patch of the status subresource, which touches no
// other resource. kubelet keeps an extended resource it did not make in
// capacity and copies it to allocatable at each status update.
func (c *Client) SetNodeExtendedResource(ctx context.Context, node, name string, value *int64) error {
	var v any
	if value != nil {
		v = strconv.FormatInt(*value, 10)
	}
	patch := map[string]any{"status": map[string]any{
		"capacity":    map[string]any{name: v},
		"allocatable": map[string]any{name: v},
	}}
	return c.do(ctx, request{
		method: http.MethodPatch, path: "/api/v1/nodes/" + url.PathEscape(node) + "/status",
		contentType: "application/merge-patch+json", body: patch,
	})
}
