package shim

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/containerd/namespaces"
	runtimeoptions "github.com/containerd/containerd/pkg/runtimeoptions/v1"
	"github.com/containerd/containerd/protobuf"
	ptypes "github.com/containerd/containerd/protobuf/types"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// plainBundle is a bundle of a container without a VM image: a busybox
// rootfs (no mounts to make) and its spec.
func plainBundle(t *testing.T) string {
	t.Helper()
	bundle := t.TempDir()
	if err := os.MkdirAll(filepath.Join(bundle, "rootfs", "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "rootfs", "bin", "busybox"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(specs.Spec{Version: specs.Version, Annotations: map[string]string{annContainerType: "container"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return bundle
}

// A plain container with plain_containers off is refused by Create before
// anything: no libvirt connection, no record, a message naming the switch.
func TestCreatePlainContainerRefusedWhenOff(t *testing.T) {
	f := &hostFake{}
	s := newTestService(t, f)
	s.trim, s.plain = newMemTrimmer(), map[string]*plainTask{}
	t.Cleanup(s.trim.stop)
	cfgPath := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfgPath, []byte("plain_containers = false\nstate_dir = "+`"`+t.TempDir()+`"`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	opts, err := typeurl.MarshalAny(&runtimeoptions.Options{ConfigPath: cfgPath})
	if err != nil {
		t.Fatal(err)
	}
	bundle := plainBundle(t)
	ctx := namespaces.WithNamespace(context.Background(), "default")
	_, err = s.Create(ctx, &taskAPI.CreateTaskRequest{ID: "sidecar", Bundle: bundle, Options: protobuf.FromAny(opts)})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "plain_containers") {
		t.Fatalf("Create = %v; want InvalidArgument naming plain_containers", err)
	}
	if n := f.connects.Load(); n != 0 {
		t.Errorf("the refusal connected to libvirt %d times", n)
	}
	assertGone(t, filepath.Join(bundle, recordFile))
	if s.hasTasks() {
		t.Errorf("a refused container was kept as a task")
	}
}

// runcFake is the embedded runc task service as the router sees it: it
// records the calls that reach it.
type runcFake struct {
	taskAPI.TaskService
	calls []string
}

func (r *runcFake) Start(_ context.Context, req *taskAPI.StartRequest) (*taskAPI.StartResponse, error) {
	r.calls = append(r.calls, "start "+req.ID)
	return &taskAPI.StartResponse{Pid: 4242}, nil
}

func (r *runcFake) Kill(_ context.Context, req *taskAPI.KillRequest) (*ptypes.Empty, error) {
	r.calls = append(r.calls, "kill "+req.ID)
	return &ptypes.Empty{}, nil
}

func (r *runcFake) Shutdown(context.Context, *taskAPI.ShutdownRequest) (*ptypes.Empty, error) {
	r.calls = append(r.calls, "shutdown")
	return &ptypes.Empty{}, nil
}

// The router hands a runc task's calls to the runc service and every
// other to the VM service; Shutdown never reaches runc's, and a shim with
// a runc task left stays up.
func TestRouterRoutesByTask(t *testing.T) {
	s := newTestService(t, &hostFake{})
	fake := &runcFake{}
	s.runc.svc = fake
	s.plain = map[string]*plainTask{"sidecar": {}}
	r := plainRouter{s}
	ctx := context.Background()
	resp, err := r.Start(ctx, &taskAPI.StartRequest{ID: "sidecar"})
	if err != nil || resp.Pid != 4242 {
		t.Fatalf("Start of the runc task = %v, %v; want the runc service's pid", resp, err)
	}
	if _, err := r.Kill(ctx, &taskAPI.KillRequest{ID: "vm", Signal: 9}); !errdefs.IsNotFound(err) {
		t.Errorf("Kill of an unknown VM task = %v; want the VM service's NotFound", err)
	}
	if _, err := r.Shutdown(ctx, &taskAPI.ShutdownRequest{}); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(fake.calls, ", "); got != "start sidecar" {
		t.Errorf("calls that reached runc: %q; want only the sidecar's start", got)
	}
	select {
	case <-s.shutdown.Done():
		t.Errorf("the shim shut down with a runc task left")
	default:
	}
}

// runcCreateFails is a runc task service whose Create fails.
type runcCreateFails struct{ taskAPI.TaskService }

func (runcCreateFails) Create(context.Context, *taskAPI.CreateTaskRequest) (*taskAPI.CreateTaskResponse, error) {
	return nil, errdefs.ErrUnavailable
}

// A pause sandbox whose runc Create fails leaves the pod's VM data as it
// was, even with no VM of the pod in this shim and only a dead shim's
// marker beside it: a pod re-created after a power loss keeps its disks
// for kubelet's next try. Its own record and marker are gone.
func TestFailedPauseCreateKeepsThePodsData(t *testing.T) {
	s := newTestService(t, &hostFake{})
	s.plain = map[string]*plainTask{}
	s.runc.once.Do(func() {}) // the runc service "started": the fake below
	s.runc.svc = runcCreateFails{}
	stateDir := t.TempDir()
	l := layout{root: stateDir}
	const uid = "pod-uid-1"
	disk := filepath.Join(l.podDir(uid), "vms", "overlay.qcow2")
	if err := os.MkdirAll(filepath.Dir(disk), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(disk, []byte("guest data"), 0o644); err != nil {
		t.Fatal(err)
	}
	dead := l.sandboxMarker(uid, "old-sandbox")
	if err := os.MkdirAll(filepath.Dir(dead), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dead, []byte(`{"pid":1999999999,"start_time":1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	bundle := t.TempDir()
	spec := &specs.Spec{Annotations: map[string]string{annContainerType: "sandbox", annSandboxUID: uid}}
	ctx := namespaces.WithNamespace(context.Background(), "k8s.io")
	req := createRequest{id: "new-sandbox", bundle: bundle, spec: spec}
	_, err := s.createPlain(ctx, &taskAPI.CreateTaskRequest{ID: "new-sandbox", Bundle: bundle}, req, stateDir, routePauseSandbox)
	if !errdefs.IsUnavailable(err) {
		t.Fatalf("createPlain = %v; want runc's error", err)
	}
	if b, err := os.ReadFile(disk); err != nil || string(b) != "guest data" {
		t.Fatalf("the pod's VM disk after a failed pause Create: %q, %v", b, err)
	}
	assertGone(t, filepath.Join(bundle, recordFile))
	assertGone(t, l.sandboxMarker(uid, "new-sandbox"))
}

// runcGone is a runc task service that no longer has the container.
type runcGone struct{ taskAPI.TaskService }

func (runcGone) Delete(context.Context, *taskAPI.DeleteRequest) (*taskAPI.DeleteResponse, error) {
	return nil, errdefs.ErrNotFound
}

// A runc task runc no longer knows is dropped at its Delete: kept, it
// would hold the shim up forever (Shutdown waits for every task).
func TestDeleteOfAGoneRuncTaskForgetsIt(t *testing.T) {
	s := newTestService(t, &hostFake{})
	s.runc.svc = runcGone{}
	bundle := t.TempDir()
	s.plain = map[string]*plainTask{"sidecar": {bundle: bundle}}
	_, err := plainRouter{s}.Delete(context.Background(), &taskAPI.DeleteRequest{ID: "sidecar"})
	if !errdefs.IsNotFound(err) {
		t.Fatalf("Delete = %v; want runc's NotFound", err)
	}
	if s.hasTasks() {
		t.Errorf("the gone runc task is still kept")
	}
}
