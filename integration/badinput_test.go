//go:build integration

package integration

import (
	"strings"
	"testing"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// badInput is a VM container that the shim must refuse with a message
// naming the problem.
type badInput struct {
	name        string
	image       string // short name in knownImages
	annotations map[string]string
	want        []string // substrings of the error
}

var badInputs = []badInput{
	{name: "nodisk", image: "nodisk", want: []string{"/disk/"}},
	{name: "twodisks", image: "twodisks", want: []string{"a.qcow2", "b.raw"}},
	{name: "escape", image: "escape", want: []string{"outside the container rootfs"}},
	{name: "corrupt", image: "corrupt", want: []string{"guest.qcow2"}},
	{name: "memory", image: "kernel", annotations: map[string]string{"kvm.containerd.io/memory": "lots"},
		want: []string{"kvm.containerd.io/memory"}},
}

// missingWords returns the wanted substrings msg lacks.
func missingWords(msg string, want []string) []string {
	var missing []string
	for _, w := range want {
		if !strings.Contains(msg, w) {
			missing = append(missing, w)
		}
	}
	return missing
}

// TestCtrBadInput: `ctr run -d` fails with a message naming the problem, and
// deleting the container leaves nothing behind.
func TestCtrBadInput(t *testing.T) {
	for _, tc := range badInputs {
		t.Run(tc.name, func(t *testing.T) {
			s := requireKVM(t, tc.image)
			s.forEachFlavour(t, func(t *testing.T, c *containerd) {
				c.cleanupAfter(t)
				id := "it-bad-" + tc.name
				args := []string{"run", "-d"}
				for k, v := range tc.annotations {
					args = append(args, "--annotation", k+"="+v)
				}
				r := c.ctr(nsDefault, append(args, c.kvmRun(s.images[tc.image].ref, id)...)...)
				if r.err == nil || r.code == 0 {
					t.Fatalf("want ctr run to fail: %v", r)
				}
				if m := missingWords(r.stderr, tc.want); len(m) > 0 {
					t.Errorf("error lacks %q: %v", m, r)
				}
				t.Logf("ctr run failed as wanted: %s", strings.TrimSpace(r.stderr))
				// ctr run leaves the container record when the task fails.
				if ls := c.mustCtr(t, nsDefault, "containers", "ls", "-q"); strings.Contains(ls.stdout, id) {
					c.mustCtr(t, nsDefault, "containers", "delete", id)
				}
				assertNothingLeft(t, c, shimID{nsDefault, id})
			})
		})
	}
}

// TestCRIBadInput: the VM container is refused through CRI. containerd's
// CRI creates the task (and so calls the shim) in StartContainer, not in
// CreateContainer, so the error may come from either call; the first error
// must name the problem.
func TestCRIBadInput(t *testing.T) {
	for _, tc := range badInputs {
		t.Run(tc.name, func(t *testing.T) {
			s := requireKVM(t, tc.image, "pause")
			s.forEachFlavour(t, func(t *testing.T, c *containerd) {
				c.cleanupAfter(t)
				cl := c.cri(t)
				p := c.runPod(t, cl, "bad-"+tc.name, "kvm", nil)
				ids := []shimID{{nsCRI, p.id}}
				cid, err := cl.createContainer(p, containerConfig("vm", s.images[tc.image].ref, tc.annotations))
				call := "CreateContainer"
				if err == nil {
					ids = append(ids, shimID{nsCRI, cid})
					ctx, cancel := criCtx()
					_, err = cl.rt.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: cid})
					cancel()
					call = "StartContainer"
				}
				if err == nil {
					t.Fatalf("CreateContainer and StartContainer of %s succeeded, want an error", tc.name)
				}
				if m := missingWords(err.Error(), tc.want); len(m) > 0 {
					t.Errorf("%s error lacks %q: %v%s", call, m, err, noCommandHint(err))
				}
				t.Logf("%s failed as wanted: %v", call, err)
				if cid != "" {
					ctx, cancel := criCtx()
					if _, err := cl.rt.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: cid}); err != nil {
						t.Errorf("RemoveContainer %s: %v", cid, err)
					}
					cancel()
				}
				cl.stopAndRemovePod(t, p)
				assertNothingLeft(t, c, ids...)
			})
		})
	}
}
