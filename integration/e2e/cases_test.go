//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// vmA is the VM pod the first cases share: direct kernel boot, stdin open
// for attach, Ready once the guest echoes on its port.
var vmA = podOpts{name: "vm-a", image: kernelImage, vm: true, stdin: true, probe: echoPort}

// A VM pod chosen by RuntimeClass runs next to a plain runc pod (the
// node's default handler), both Running and Ready; the VM answers on its
// pod IP.
func testVMNextToRunc(t *testing.T, e *env) {
	e.apply(t, pod(vmA), pod(podOpts{name: "runc-a", image: pauseImage}))
	v := e.waitReady(t, vmA.name)
	r := e.waitReady(t, "runc-a")
	if rc := e.kubectl(t, "get", "pod", vmA.name, "-o", "jsonpath={.spec.runtimeClassName}"); rc != "kvm" {
		t.Errorf("runtimeClassName of %s: %q", vmA.name, rc)
	}
	t.Logf("VM in libvirt domain %s; runc pod %s", e.vmDomain(t, v.Metadata.UID), r)
	waitEcho(t, net.JoinHostPort(v.Status.PodIP, strconv.Itoa(echoPort)), "hello-vm-a", shortTimeout)
	e.deletePod(t, "runc-a")
}

// kubectl logs shows the guest's console; logs -f follows it; attach -i
// sends stdin to the guest's console shell.
func testLogsAndAttach(t *testing.T, e *env) {
	if logs := e.kubectl(t, "logs", vmA.name); !strings.Contains(logs, readyLine) || !strings.Contains(logs, netLine) {
		t.Errorf("kubectl logs %s lacks the guest's console (%s, %s):\n%s", vmA.name, readyLine, netLine, testenv.Tail(logs, 20))
	}
	follow := e.startStream(t, false, "logs", "-f", vmA.name)
	follow.waitFor(t, readyLine, shortTimeout)
	attach := e.startStream(t, true, "attach", "-i", vmA.name, "-c", "vm")
	// The guest's shell computes the marker: the echo of the typed line
	// does not contain it.
	attach.sendUntil(t, "echo ATTACH-$((6*7))", "ATTACH-42", time.Second, shortTimeout)
	follow.waitFor(t, "ATTACH-42", shortTimeout)
}

// A tcpSocket readiness probe keeps a running VM pod unready until the
// guest listens on the port: here until a listener is started through the
// console.
func testReadiness(t *testing.T, e *env) {
	const port = 8080
	o := podOpts{name: "vm-gate", image: kernelImage, vm: true, stdin: true, probe: port}
	e.apply(t, pod(o))
	defer e.deletePod(t, o.name)
	e.waitPod(t, o.name, bootTimeout, "Running", (*podStatus).running)
	// Once the guest's network is up, the probe has had time to fail.
	follow := e.startStream(t, false, "logs", "-f", o.name)
	follow.waitFor(t, netLine, bootTimeout)
	time.Sleep(5 * time.Second)
	if p, err := e.getPod(o.name); err != nil || !p.running() || p.ready() {
		t.Fatalf("with nothing listening on %d: %v %v, want running and not Ready", port, p, err)
	}
	attach := e.startStream(t, true, "attach", "-i", o.name, "-c", "vm")
	attach.send(t, fmt.Sprintf("nc -ll -p %d -e /bin/cat & echo LISTEN-$((%d+1))", port, port))
	attach.waitFor(t, fmt.Sprintf("LISTEN-%d", port+1), shortTimeout)
	p := e.waitPod(t, o.name, shortTimeout, "Ready after the guest listened", func(p *podStatus) bool { return p.ready() })
	waitEcho(t, net.JoinHostPort(p.Status.PodIP, strconv.Itoa(port)), "gate-open", shortTimeout)
}

// A ClusterIP Service (kube-proxy, iptables) in front of a two-replica
// Deployment of VM pods answers through the Service IP.
func testService(t *testing.T, e *env) {
	o := podOpts{name: "echo", image: kernelImage, vm: true, probe: echoPort}
	e.apply(t, deployment("echo", 2, o), service("echo", o.podLabels(), 7777, echoPort))
	defer e.kubectl(t, "delete", "deployment,service", "echo", "--wait=true", "--timeout=2m")
	e.kubectl(t, "rollout", "status", "deployment/echo", "--timeout=4m")

	var slices struct {
		Items []struct {
			Endpoints []struct {
				Addresses  []string `json:"addresses"`
				Conditions struct {
					Ready *bool `json:"ready"`
				} `json:"conditions"`
			} `json:"endpoints"`
		} `json:"items"`
	}
	ctx, cancel := context.WithTimeout(context.Background(), shortTimeout)
	defer cancel()
	var ready []string
	if err := testenv.Poll(ctx, 500*time.Millisecond, func() (bool, string) {
		out, err := e.cluster.Kubectl(ctx, nil, "get", "endpointslices", "-l", "kubernetes.io/service-name=echo", "-o", "json")
		if err != nil {
			return false, err.Error()
		}
		if err := json.Unmarshal([]byte(out), &slices); err != nil {
			return false, err.Error()
		}
		ready = nil
		for _, s := range slices.Items {
			for _, ep := range s.Endpoints {
				if ep.Conditions.Ready != nil && *ep.Conditions.Ready {
					ready = append(ready, ep.Addresses...)
				}
			}
		}
		return len(ready) == 2, fmt.Sprintf("ready endpoints %v", ready)
	}); err != nil {
		t.Fatalf("service echo: %v", err)
	}
	ip := strings.TrimSpace(e.kubectl(t, "get", "service", "echo", "-o", "jsonpath={.spec.clusterIP}"))
	addr := net.JoinHostPort(ip, "7777")
	waitEcho(t, addr, "through-the-service", shortTimeout)
	for i := 0; i < 6; i++ {
		if err := echo(addr, fmt.Sprintf("round-%d", i)); err != nil {
			t.Errorf("service %s, connection %d: %v", addr, i, err)
		}
	}
	// Each replica answers on its own too (the Service spreads at random).
	for _, a := range ready {
		if err := echo(net.JoinHostPort(a, strconv.Itoa(echoPort)), "replica"); err != nil {
			t.Errorf("replica %s: %v", a, err)
		}
	}
}

// The summary API and /metrics/resource, read through the apiserver's
// node proxy, report the VM's CPU and memory at container level, and at
// pod level (QEMU runs in the pod's cgroup).
func testStats(t *testing.T, e *env) {
	type usage struct {
		CPU struct {
			UsageCoreNanoSeconds uint64 `json:"usageCoreNanoSeconds"`
		} `json:"cpu"`
		Memory struct {
			WorkingSetBytes uint64 `json:"workingSetBytes"`
		} `json:"memory"`
	}
	var summary struct {
		Pods []struct {
			PodRef struct {
				Name string `json:"name"`
			} `json:"podRef"`
			usage
			Containers []struct {
				Name string `json:"name"`
				usage
			} `json:"containers"`
		} `json:"pods"`
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var detail string
	err := testenv.Poll(ctx, time.Second, func() (bool, string) {
		out, err := e.cluster.Kubectl(ctx, nil, "get", "--raw", "/api/v1/nodes/"+nodeName+"/proxy/stats/summary")
		if err != nil {
			return false, err.Error()
		}
		if err := json.Unmarshal([]byte(out), &summary); err != nil {
			return false, err.Error()
		}
		for _, p := range summary.Pods {
			if p.PodRef.Name != vmA.name {
				continue
			}
			for _, c := range p.Containers {
				if c.Name == "vm" {
					detail = fmt.Sprintf("container vm: cpu %d ns, working set %d bytes; pod: cpu %d ns, working set %d bytes",
						c.CPU.UsageCoreNanoSeconds, c.Memory.WorkingSetBytes, p.CPU.UsageCoreNanoSeconds, p.Memory.WorkingSetBytes)
					// QEMU runs in the pod's cgroup: the pod level counts it too.
					return c.CPU.UsageCoreNanoSeconds > 0 && c.Memory.WorkingSetBytes > 0 &&
						p.CPU.UsageCoreNanoSeconds > 0 && p.Memory.WorkingSetBytes >= c.Memory.WorkingSetBytes/2, detail
				}
			}
		}
		return false, "no container vm of pod " + vmA.name + " in the summary"
	})
	if err != nil {
		t.Errorf("summary API: %v", err)
	} else {
		t.Logf("summary API: %s", detail)
	}

	out := e.kubectl(t, "get", "--raw", "/api/v1/nodes/"+nodeName+"/proxy/metrics/resource")
	for _, metric := range []string{"container_cpu_usage_seconds_total", "container_memory_working_set_bytes"} {
		v, ok := promSample(out, metric, `container="vm"`, `pod="`+vmA.name+`"`)
		if !ok || v <= 0 {
			t.Errorf("/metrics/resource: %s of %s/vm is %v (found %v)", metric, vmA.name, v, ok)
		} else {
			t.Logf("/metrics/resource: %s{pod=%q,container=\"vm\"} %g", metric, vmA.name, v)
		}
	}
}

// promSample finds the sample of metric whose labels include every one of
// labels in Prometheus text output.
func promSample(text, metric string, labels ...string) (float64, bool) {
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, metric+"{") {
			continue
		}
		end := strings.Index(line, "}")
		if end < 0 {
			continue
		}
		all := true
		for _, l := range labels {
			all = all && strings.Contains(line[:end], l)
		}
		if !all {
			continue
		}
		fields := strings.Fields(line[end+1:])
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		return v, err == nil
	}
	return 0, false
}

// kubectl delete pod powers the guest off by ACPI within the grace period,
// and nothing of the pod is left: domain, pod network namespace (with the
// TAP in it), mounts, the shim's and kubelet's pod directories.
func testDelete(t *testing.T, e *env) {
	p, err := e.getPod(vmA.name)
	if err != nil {
		t.Fatal(err)
	}
	uid := p.Metadata.UID
	domain := e.vmDomain(t, uid)
	netns := e.sandboxNetns(t, uid)
	cid := strings.TrimPrefix(p.container().ContainerID, "containerd://")
	follow := e.startStream(t, false, "logs", "-f", vmA.name)
	follow.waitFor(t, readyLine, shortTimeout)
	mark := e.cluster.LogSize("kubelet")
	start := time.Now()
	e.kubectl(t, "delete", "pod", vmA.name, "--wait=false")
	// kubelet logs the container's end with its exit code: 0 is the guest
	// powering off (ACPI), 137 a destroy at the end of the grace period.
	const grace = 30 * time.Second
	var code string
	ctx, cancel := context.WithTimeout(context.Background(), grace+shortTimeout)
	defer cancel()
	if err := testenv.Poll(ctx, 200*time.Millisecond, func() (bool, string) {
		code = containerExitCode(e.cluster.LogSince("kubelet", mark), cid)
		return code != "", "kubelet logged no end of container " + cid
	}); err != nil {
		t.Fatal(err)
	}
	finished := time.Since(start)
	follow.waitFor(t, poweroffLine, shortTimeout)
	if code != "0" || finished >= grace {
		t.Errorf("the VM container ended with exit code %s after %s, want 0 within the grace period %s (a powered-off guest)", code, finished,
			grace)
	}
	e.kubectl(t, "wait", "--for=delete", "pod/"+vmA.name, "--timeout=90s")
	t.Logf("kubectl delete pod %s: the guest printed %s and the container ended (exit code %s) after %s; the pod was gone after %s",
		vmA.name, poweroffLine, code, finished.Round(10*time.Millisecond), time.Since(start).Round(10*time.Millisecond))

	// kubelet removes a deleted pod's sandbox (and so the pod's disk) in
	// its container garbage collection, once a minute.
	var left []string
	gcCtx, gcCancel := context.WithTimeout(context.Background(), sandboxGCTimeout)
	defer gcCancel()
	_ = testenv.Poll(gcCtx, 500*time.Millisecond, func() (bool, string) {
		left = e.podLeftovers(uid, domain, netns)
		return len(left) == 0, ""
	})
	if len(left) > 0 {
		t.Errorf("left of the deleted pod:\n  %s", strings.Join(left, "\n  "))
	} else {
		t.Logf("nothing of pod %s left %s after kubectl delete", vmA.name, time.Since(start).Round(time.Second))
	}
}

// containerExitCode finds kubelet's log line about the end of container
// cid ("Generic (PLEG): container finished" ... exitCode=N) and returns N,
// or "" when there is none.
func containerExitCode(kubeletLog, cid string) string {
	for _, line := range strings.Split(kubeletLog, "\n") {
		if !strings.Contains(line, "container finished") || !strings.Contains(line, `containerID="`+cid+`"`) {
			continue
		}
		if _, code, ok := strings.Cut(line, "exitCode="); ok {
			return strings.Fields(code)[0]
		}
	}
	return ""
}

// sandboxNetns returns the network namespace path of the pod's sandbox.
func (e *env) sandboxNetns(t *testing.T, uid string) string {
	t.Helper()
	r := e.ctd.Ctr(context.Background(), testenv.NamespaceCRI, "containers", "ls", "-q",
		`labels."io.kubernetes.pod.uid"==`+uid+`,labels."io.cri-containerd.kind"==sandbox`)
	ids := strings.Fields(r.Stdout)
	if r.Err != nil || len(ids) != 1 {
		t.Fatalf("the sandbox of pod %s: %v", uid, r)
	}
	r = e.ctd.Ctr(context.Background(), testenv.NamespaceCRI, "containers", "info", ids[0])
	var info struct {
		Spec struct {
			Linux struct {
				Namespaces []struct{ Type, Path string } `json:"namespaces"`
			} `json:"linux"`
		} `json:"Spec"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &info); err != nil {
		t.Fatalf("ctr containers info %s: %v: %v", ids[0], err, r)
	}
	for _, ns := range info.Spec.Linux.Namespaces {
		if ns.Type == "network" && ns.Path != "" {
			return ns.Path
		}
	}
	t.Fatalf("sandbox %s has no network namespace path", ids[0])
	return ""
}

// podLeftovers lists what is left of a deleted pod.
func (e *env) podLeftovers(uid, domain, netns string) []string {
	var left []string
	if l, err := testenv.ConnectLibvirt(); err == nil {
		if _, domainLookupByNameErr := l.DomainLookupByName(domain); domainLookupByNameErr == nil {
			left = append(left, "libvirt domain "+domain)
		}
		_ = l.Disconnect()
	} else {
		left = append(left, err.Error())
	}
	for _, p := range []string{
		netns,
		filepath.Join(e.ctd.ShimStateDir, "pods", uid),
		filepath.Join(e.ctd.ShimStateDir, "vms", domain),
		filepath.Join(e.cluster.KubeletDir, "pods", uid),
	} {
		if _, err := os.Lstat(p); err == nil {
			left = append(left, p)
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mounts), "\n") {
		if strings.Contains(line, uid) || strings.Contains(line, domain) || (netns != "" && strings.Contains(line, netns)) {
			left = append(left, "mount "+line)
		}
	}
	r := e.ctd.Ctr(context.Background(), testenv.NamespaceCRI, "containers", "ls", "-q", `labels."io.kubernetes.pod.uid"==`+uid)
	if ids := strings.Fields(r.Stdout); len(ids) > 0 {
		left = append(left, fmt.Sprintf("containers %v", ids))
	}
	return left
}

// testCleanRunLogs reads what kubelet and containerd logged during the
// cases above, which a user would call a clean run: nothing may be an
// error about a VM pod or our runtime.
func testCleanRunLogs(t *testing.T, e *env) {
	var bad []string
	for _, line := range strings.Split(e.ctd.LogTail(0, 1<<30), "\n") {
		if strings.Contains(line, "level=error") && mentionsVM(line) {
			bad = append(bad, "containerd: "+line)
		}
	}
	for _, line := range strings.Split(e.cluster.LogSince("kubelet", 0), "\n") {
		if strings.HasPrefix(line, "E") && mentionsVM(line) && !deletedPodStatusRace(line) {
			bad = append(bad, "kubelet: "+line)
		}
	}
	if len(bad) > 0 {
		t.Errorf("errors about VM pods or the kvm runtime in a clean run:\n%s", strings.Join(bad, "\n"))
	}
}

// deletedPodStatusRace is kubelet's status manager asking for a pod the
// API server has just deleted: the node authorizer has already dropped the
// pod from the node's graph, so the read is forbidden. kubelet logs it as
// an error for a pod of any runtime (seen once on 2.x after
// DeletePowersOff's kubectl delete); it says nothing about the VM.
func deletedPodStatusRace(line string) bool {
	return strings.Contains(line, "Failed to get status for pod") &&
		strings.Contains(line, "is forbidden") &&
		strings.Contains(line, "no relationship found between node")
}

// mentionsVM reports whether a log line is about the kvm runtime or one
// of the VM pods of the clean cases.
func mentionsVM(line string) bool {
	line = strings.ReplaceAll(line, nodeName, "") // "kvm-e2e-node" is no VM
	for _, s := range []string{"kvm", vmA.name, "vm-gate", "echo-", volPodName} {
		if strings.Contains(line, s) {
			return true
		}
	}
	return false
}

// A VM destroyed behind kubelet's back (virsh destroy) is restarted by
// kubelet on the same disk: the guest reads back what it wrote before.
func testVirshDestroy(t *testing.T, e *env) {
	// No readiness probe: this case needs the guest's console and disk,
	// not its network.
	o := podOpts{name: "vm-disk", image: biosImage, vm: true, stdin: true}
	e.apply(t, pod(o))
	defer e.deletePod(t, o.name)
	p := e.waitReady(t, o.name)
	domain := e.vmDomain(t, p.Metadata.UID)
	e.startStream(t, false, "logs", "-f", o.name).waitFor(t, readyLine, bootTimeout)

	// The bios image's boot partition (FAT, label KVMGUEST) is the guest's
	// writable disk.
	const mount = "umount /mnt/d 2>/dev/null; mkdir -p /mnt/d && mount -t vfat -o codepage=437,iocharset=ascii $(findfs LABEL=KVMGUEST) /mnt/d"
	attach := e.startStream(t, true, "attach", "-i", o.name, "-c", "vm")
	attach.sendUntil(t, mount+" && echo kept-$((40+2)) >/mnt/d/e2emark && umount /mnt/d && sync && echo WROTE-$((1+1))",
		"WROTE-2", 3*time.Second, bootTimeout)
	attach.stop()

	if out, err := exec.Command("virsh", "-c", "qemu:///system", "destroy", domain).CombinedOutput(); err != nil {
		t.Fatalf("virsh destroy %s: %v: %s", domain, err, out)
	}
	p = e.waitPod(t, o.name, bootTimeout, "restarted", func(p *podStatus) bool {
		return p.container().RestartCount >= 1 && p.running()
	})
	c := p.container()
	if c.RestartCount != 1 {
		t.Errorf("restartCount %d, want 1", c.RestartCount)
	}
	if c.LastState.Terminated == nil || c.LastState.Terminated.ExitCode != 137 {
		t.Errorf("last state %+v, want terminated with exit code 137 (destroyed)", c.LastState.Terminated)
	}
	attach = e.startStream(t, true, "attach", "-i", o.name, "-c", "vm")
	attach.sendUntil(t, mount+" ; cat /mnt/d/e2emark ; umount /mnt/d", "kept-42", 3*time.Second, bootTimeout)
}

// containerd, then kubelet, restarted while a VM pod runs: the pod keeps
// running (no restart) and still answers.
func testDaemonRestarts(t *testing.T, e *env) {
	o := podOpts{name: "vm-b", image: kernelImage, vm: true, probe: echoPort}
	e.apply(t, pod(o))
	defer e.deletePod(t, o.name)
	before := e.waitReady(t, o.name)
	addr := net.JoinHostPort(before.Status.PodIP, strconv.Itoa(echoPort))
	waitEcho(t, addr, "before", shortTimeout)

	ctx := context.Background()
	if err := e.ctd.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	waitEcho(t, addr, "after-containerd", shortTimeout)
	if err := e.cluster.RestartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	// Give kubelet a few syncs to find anything wrong with the pod.
	time.Sleep(15 * time.Second)
	after := e.waitReady(t, o.name)
	if c := after.container(); c.RestartCount != 0 || c.ContainerID != before.container().ContainerID {
		t.Errorf("after the restarts: restartCount %d, container %s (was %s), want 0 and the same container",
			c.RestartCount, c.ContainerID, before.container().ContainerID)
	}
	waitEcho(t, addr, "after-kubelet", shortTimeout)
}

// kubectl exec runs a command in the guest through the QEMU guest agent:
// its output, its exit code and its stdin reach the user, and an exec
// readiness probe keeps the pod unready until its command succeeds.
func testExec(t *testing.T, e *env) {
	o := podOpts{name: "vm-exec", image: kernelImage, vm: true, execProbe: []string{"cat", "/run/e2e-ready"}}
	e.apply(t, pod(o))
	defer e.deletePod(t, o.name)
	e.waitPod(t, o.name, bootTimeout, "Running", (*podStatus).running)
	e.startStream(t, false, "logs", "-f", o.name).waitFor(t, agentLine, bootTimeout)

	ctx, cancel := context.WithTimeout(context.Background(), shortTimeout)
	defer cancel()
	// The agent starts with the guest; retry the first exec until it answers.
	var uname string
	if err := testenv.Poll(ctx, 500*time.Millisecond, func() (bool, string) {
		out, err := e.cluster.Kubectl(ctx, nil, "exec", o.name, "--", "uname", "-s")
		uname = strings.TrimSpace(out)
		return err == nil && uname == "Linux", fmt.Sprintf("%q %v", out, err)
	}); err != nil {
		t.Fatalf("kubectl exec %s -- uname -s: %v", o.name, err)
	}
	// The probe's file does not exist yet: not Ready.
	time.Sleep(3 * time.Second)
	if p, err := e.getPod(o.name); err != nil || p.ready() {
		t.Fatalf("exec probe failing: %v %v, want not Ready", p, err)
	}
	e.kubectl(t, "exec", o.name, "--", "touch", "/run/e2e-ready")
	e.waitPod(t, o.name, shortTimeout, "Ready once the exec probe succeeds", func(p *podStatus) bool { return p.ready() })

	if out, err := e.cluster.Kubectl(ctx, []byte("through-stdin\n"), "exec", "-i", o.name, "--", "cat"); err != nil ||
		out != "through-stdin\n" {
		t.Errorf("kubectl exec -i -- cat with stdin: %q, %v", out, err)
	}
	// The guest's shell computes the markers, so the command line in an
	// error message does not contain them.
	out, err := e.cluster.Kubectl(ctx, nil, "exec", o.name, "--", "sh", "-c", "echo OUT-$((6*7)); echo ERR-$((6*7)) >&2; exit 3")
	if err == nil || !strings.Contains(err.Error(), "exit status 3") || out != "OUT-42\n" || !strings.Contains(err.Error(), "ERR-42") {
		t.Errorf("kubectl exec of a command that exits 3: stdout %q, %v; want stdout OUT-42, stderr ERR-42 and exit status 3", out, err)
	}
	if _, err := e.cluster.Kubectl(ctx, nil, "exec", o.name, "--", "no-such-command"); err == nil ||
		!strings.Contains(err.Error(), "exit status 127") {
		t.Errorf("kubectl exec of a missing command: %v, want exit status 127", err)
	}
}
