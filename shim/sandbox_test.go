package shim

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	apitypes "github.com/containerd/containerd/api/types"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/opencontainers/runtime-spec/specs-go/features"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/kvm-shim/containerd-shim-kvm-v1/vmplan"
)

func newSandbox(t *testing.T, l layout, id, podUID string) *sandboxTask {
	t.Helper()
	spec := &specs.Spec{Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.NetworkNamespace, Path: "/var/run/netns/cni-1"}}}}
	sb, err := createSandboxTask(context.Background(), l, createRequest{id: id, bundle: t.TempDir(), spec: spec},
		vmplan.Identity{Namespace: "k8s.io", PodUID: podUID}, func(any) {})
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

func TestSandboxLifecycle(t *testing.T) {
	l := layout{root: t.TempDir()}
	sb := newSandbox(t, l, "sb1", "pod-1")
	if sb.netns != "/var/run/netns/cni-1" {
		t.Errorf("netns %q", sb.netns)
	}
	pid, err := sb.start(context.Background())
	if err != nil || pid != os.Getpid() {
		t.Fatalf("start: %d, %v", pid, err)
	}
	if err := sb.delete(context.Background(), false); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("delete while running: %v", err)
	}
	if err := sb.kill(context.Background(), uint32(unix.SIGTERM)); err != nil {
		t.Fatal(err)
	}
	if _, _, st, _ := sb.snapshot(); st != 0 {
		t.Errorf("SIGTERM exit status %d, want 0 like pause", st)
	}
	if err := sb.kill(context.Background(), uint32(unix.SIGKILL)); !errdefs.IsNotFound(err) {
		t.Errorf("second kill: %v", err)
	}
	if err := sb.delete(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(l.podDir("pod-1")); err == nil {
		t.Error("pod data left after the last sandbox was deleted")
	}
}

func TestPodDataOutlivesSandboxRestart(t *testing.T) {
	l := layout{root: t.TempDir()}
	old := newSandbox(t, l, "sb-old", "pod-1")
	data := filepath.Join(l.podVMDir("pod-1", "vm"), "overlay.qcow2")
	if err := os.MkdirAll(filepath.Dir(data), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(data, []byte("disk"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The old sandbox's shim died: containerd's cleanup keeps pod data.
	if err := releaseSandbox(context.Background(), l, &old.rec, false); err != nil {
		t.Fatal(err)
	}
	// A new sandbox of the same pod comes up while a stale marker of a
	// dead shim is still around.
	stale := l.sandboxMarker("pod-1", "sb-dead")
	b, _ := json.Marshal(marker{Pid: 1 << 30, StartTime: 1})
	if err := os.WriteFile(stale, b, 0o600); err != nil {
		t.Fatal(err)
	}
	second := newSandbox(t, l, "sb-new", "pod-1")
	third := newSandbox(t, l, "sb-other", "pod-1")
	if err := second.delete(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(data); err != nil {
		t.Fatalf("pod data removed while another sandbox of the pod lives: %v", err)
	}
	if err := third.delete(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(l.podDir("pod-1")); err == nil {
		t.Error("pod data left after the last live sandbox was deleted")
	}
}

func TestSandboxKeepsPodDataWhileVMsRemain(t *testing.T) {
	l := layout{root: t.TempDir()}
	sb := newSandbox(t, l, "sb1", "pod-1")
	if err := sb.delete(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(l.podDir("pod-1")); err != nil {
		t.Errorf("pod data removed while a VM of the pod is still in the shim: %v", err)
	}
}

func TestWriteRuntimeInfo(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteRuntimeInfo(&buf, "1.2.3", "abc"); err != nil {
		t.Fatal(err)
	}
	var info apitypes.RuntimeInfo
	if err := proto.Unmarshal(buf.Bytes(), &info); err != nil {
		t.Fatal(err)
	}
	if info.Name != RuntimeName || info.Version.GetVersion() != "1.2.3" {
		t.Errorf("info %v", &info)
	}
	var f features.Features
	if err := json.Unmarshal(info.Features.GetValue(), &f); err != nil || f.OCIVersionMin == "" {
		t.Errorf("features %q: %v", info.Features.GetValue(), err)
	}
}

// A sandbox that comes first on a fresh node must not make the state dir
// or the pod's VM data dir unreachable for the QEMU user.
func TestSandboxFirstKeepsStateDirSearchable(t *testing.T) {
	l := layout{root: filepath.Join(t.TempDir(), "state")}
	newSandbox(t, l, "sb1", "pod-1")
	if err := l.ensurePodVMDir("pod-1", "vm"); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{l.root, filepath.Join(l.root, "vms"), filepath.Join(l.root, "pods"), l.podDir("pod-1"),
		l.podVMDir("pod-1", "vm")} {
		st, err := os.Stat(d)
		if err != nil || st.Mode().Perm()&0o001 == 0 {
			t.Errorf("%s: mode %v, %v", d, st.Mode(), err)
		}
	}
}
