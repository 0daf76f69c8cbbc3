package nodeinstall

import (
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/kubeapi"
)

// fakeAPI is an API server holding one node, the pods on it and the
// events created.
type fakeAPI struct {
	mu      sync.Mutex // guards the fields below
	node    kubeapi.Node
	pods    []kubeapi.Pod
	events  []kubeapi.Event
	patches int
	// capacity and allocatable are the node status's extended resources;
	// calls lists "label" and "status" in the order they were patched.
	capacity, allocatable map[string]string
	calls                 []string
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/api/v1/nodes/"+f.node.Metadata.Name:
		_ = json.NewEncoder(w).Encode(f.node)
	case r.Method == http.MethodPatch && r.URL.Path == "/api/v1/nodes/"+f.node.Metadata.Name:
		if r.Header.Get("Content-Type") != "application/merge-patch+json" {
			http.Error(w, `{"message":"bad content type"}`, http.StatusUnsupportedMediaType)
			return
		}
		var p struct {
			Metadata struct {
				Labels map[string]*string `json:"labels"`
			} `json:"metadata"`
		}
		_ = json.NewDecoder(r.Body).Decode(&p)
		if f.node.Metadata.Labels == nil {
			f.node.Metadata.Labels = map[string]string{}
		}
		for k, v := range p.Metadata.Labels {
			if v == nil {
				delete(f.node.Metadata.Labels, k)
			} else {
				f.node.Metadata.Labels[k] = *v
			}
		}
		f.patches++
		f.calls = append(f.calls, "label")
		_ = json.NewEncoder(w).Encode(f.node)
	case r.Method == http.MethodPatch && r.URL.Path == "/api/v1/nodes/"+f.node.Metadata.Name+"/status":
		f.patchStatus(w, r)
	case r.Method == http.MethodGet && r.URL.Path == "/api/v1/pods":
		want := "spec.nodeName=" + f.node.Metadata.Name
		var items []kubeapi.Pod
		for _, p := range f.pods {
			if r.URL.Query().Get("fieldSelector") == want && p.Spec.NodeName == f.node.Metadata.Name {
				items = append(items, p)
			}
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"items": items})
	case r.Method == http.MethodPost && r.URL.Path == "/api/v1/namespaces/default/events":
		var e kubeapi.Event
		b, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(b, &e)
		f.events = append(f.events, e)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(b)
	default:
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"kind":"Status","code":404,"reason":"NotFound","message":"no such thing"}`))
	}
}

// patchStatus applies a merge patch of the node status's capacity and
// allocatable (guarded by f.mu, held by ServeHTTP).
func (f *fakeAPI) patchStatus(w http.ResponseWriter, r *http.Request) {
	var p struct {
		Status struct {
			Capacity    map[string]*string `json:"capacity"`
			Allocatable map[string]*string `json:"allocatable"`
		} `json:"status"`
	}
	if r.Header.Get("Content-Type") != "application/merge-patch+json" || json.NewDecoder(r.Body).Decode(&p) != nil {
		http.Error(w, `{"message":"bad patch"}`, http.StatusBadRequest)
		return
	}
	merge := func(into *map[string]string, from map[string]*string) {
		if *into == nil {
			*into = map[string]string{}
		}
		for k, v := range from {
			if v == nil {
				delete(*into, k)
			} else {
				(*into)[k] = *v
			}
		}
	}
	merge(&f.capacity, p.Status.Capacity)
	merge(&f.allocatable, p.Status.Allocatable)
	f.calls = append(f.calls, "status")
	_ = json.NewEncoder(w).Encode(f.node)
}

// resource is the node's extended resource name in capacity, and
// whether allocatable says the same.
func (f *fakeAPI) resource(name string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.capacity[name]
	return c, ok && f.allocatable[name] == c
}

// fakeCapacity gives a fixed capacity, or an error.
type fakeCapacity struct {
	n   int64
	err error
}

func (c *fakeCapacity) VCPUCapacity(context.Context) (int64, error) { return c.n, c.err }

func (f *fakeAPI) label() (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.node.Metadata.Labels[Label]
	return v, ok
}

// fakeRestarter counts restarts.
type fakeRestarter struct{ n int }

func (r *fakeRestarter) Restart(context.Context) error { r.n++; return nil }

// fakeChecker passes, or fails naming checks; it records the requests.
type fakeChecker struct {
	fail []string
	reqs []CheckRequest
}

func (c *fakeChecker) Check(_ context.Context, r CheckRequest) (CheckResult, error) {
	c.reqs = append(c.reqs, r)
	if len(c.fail) > 0 {
		var out strings.Builder
		for _, n := range c.fail {
			out.WriteString("FAIL  " + n + "  it is broken\n")
		}
		return CheckResult{Failed: c.fail, Output: out.String()}, nil
	}
	return CheckResult{Passed: true, Output: "ok    config  fine\n"}, nil
}

// rig is a fake node: a host root in a temp dir, a payload built from
// the tree's deploy/deb snippets and config.example.toml, a fake API
// server, restarter and checker.
type rig struct {
	in       *Installer
	api      *fakeAPI
	restart  *fakeRestarter
	check    *fakeChecker
	capacity *fakeCapacity
}

func newRig(t *testing.T, containerd string) *rig {
	t.Helper()
	dir := t.TempDir()
	l := DefaultLayout()
	l.HostRoot, l.Payload = filepath.Join(dir, "host"), filepath.Join(dir, "payload")
	must(t, os.MkdirAll(l.HostRoot, 0o755))
	writePayload(t, l.Payload, "shim N", "wrapper N")
	api := &fakeAPI{}
	api.node.Metadata.Name, api.node.Metadata.UID = "node-a", "uid-1"
	api.node.Status.NodeInfo.ContainerRuntimeVersion = containerd
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	r := &rig{api: api, restart: &fakeRestarter{}, check: &fakeChecker{}, capacity: &fakeCapacity{n: 8}}
	r.in = &Installer{
		Layout: l, Node: "node-a",
		Kube:    &kubeapi.Client{Server: srv.URL, HTTP: srv.Client()},
		Restart: r.restart, Check: r.check, EventNamespace: "default",
		Capacity: r.capacity,
	}
	return r
}

// writePayload lays out an installer image's payload with the tree's
// own containerd snippets and default config.
func writePayload(t *testing.T, dir, shim, wrapper string) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Join(dir, "bin"), 0o755))
	must(t, os.MkdirAll(filepath.Join(dir, "containerd"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "bin", ShimName), []byte(shim), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "bin", WrapperName), []byte(wrapper), 0o755))
	for _, f := range []string{"containerd-v2.toml", "containerd-v2-runc.toml", "containerd-v3.toml"} {
		b, err := os.ReadFile(filepath.Join("..", "deploy", "deb", f))
		must(t, err)
		must(t, os.WriteFile(filepath.Join(dir, "containerd", f), b, 0o644))
	}
	b, err := os.ReadFile(filepath.Join("..", "config.example.toml"))
	must(t, err)
	must(t, os.WriteFile(filepath.Join(dir, "config.toml"), b, 0o644))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// hostFile writes a file of the fake node.
func (r *rig) hostFile(t *testing.T, path, content string) {
	t.Helper()
	p := r.in.Layout.host(path)
	must(t, os.MkdirAll(filepath.Dir(p), 0o755))
	must(t, os.WriteFile(p, []byte(content), 0o644))
}

func (r *rig) read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(r.in.Layout.host(path))
	must(t, err)
	return string(b)
}

// snapshot maps every regular file below the host root to its content
// and mode.
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	m := map[string]string{}
	must(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		m[strings.TrimPrefix(p, root)] = fi.Mode().String() + " " + string(b)
		return nil
	}))
	return m
}

func sameSnapshot(t *testing.T, what string, a, b map[string]string) {
	t.Helper()
	for k, v := range a {
		if b[k] != v {
			t.Errorf("%s: %s changed:\n--- before\n%s\n--- after\n%s", what, k, v, b[k])
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			t.Errorf("%s: %s appeared", what, k)
		}
	}
}
