//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// Timeouts under TCG on a shared 2-core host.
const (
	bootTimeout  = 2 * time.Minute // pod applied -> guest ready
	shortTimeout = 30 * time.Second
	// kubelet's container garbage collection runs once a minute; it
	// removes the containers and sandboxes of deleted pods.
	sandboxGCTimeout = 150 * time.Second
)

// Console lines of the test guest (hack/guest/README.md).
const (
	readyLine    = "KVM-GUEST-READY"
	poweroffLine = "KVM-GUEST-POWEROFF"
	netLine      = "KVM-GUEST-NET "
	agentLine    = "KVM-GUEST-AGENT /dev/" // the guest agent runs on its port
)

// echoPort is where the test guest echoes TCP (hack/guest/init).
const echoPort = 7

// kubectl runs kubectl and fails t on error.
func (e *env) kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := e.cluster.Kubectl(context.Background(), nil, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func (e *env) apply(t *testing.T, objects ...any) {
	t.Helper()
	if err := e.cluster.Apply(context.Background(), objects...); err != nil {
		t.Fatal(err)
	}
}

// podStatus is what the tests read of a pod.
type podStatus struct {
	Metadata struct {
		Name string `json:"name"`
		UID  string `json:"uid"`
	} `json:"metadata"`
	Spec struct {
		NodeName string `json:"nodeName"`
	} `json:"spec"`
	Status struct {
		Phase      string `json:"phase"`
		PodIP      string `json:"podIP"`
		Conditions []struct {
			Type   string `json:"type"`
			Status string `json:"status"`
		} `json:"conditions"`
		ContainerStatuses []containerStatus `json:"containerStatuses"`
	} `json:"status"`
}

type containerStatus struct {
	Name         string `json:"name"`
	Ready        bool   `json:"ready"`
	RestartCount int    `json:"restartCount"`
	ContainerID  string `json:"containerID"`
	State        struct {
		Running    *struct{} `json:"running"`
		Terminated *struct {
			ExitCode int    `json:"exitCode"`
			Reason   string `json:"reason"`
		} `json:"terminated"`
		Waiting *struct {
			Reason  string `json:"reason"`
			Message string `json:"message"`
		} `json:"waiting"`
	} `json:"state"`
	LastState struct {
		Terminated *struct {
			ExitCode int    `json:"exitCode"`
			Reason   string `json:"reason"`
		} `json:"terminated"`
	} `json:"lastState"`
}

func (p *podStatus) ready() bool {
	for _, c := range p.Status.Conditions {
		if c.Type == "Ready" {
			return c.Status == "True"
		}
	}
	return false
}

func (p *podStatus) container() containerStatus {
	if len(p.Status.ContainerStatuses) == 0 {
		return containerStatus{}
	}
	return p.Status.ContainerStatuses[0]
}

// running reports whether the pod is Running with its container running.
func (p *podStatus) running() bool {
	return p.Status.Phase == "Running" && p.container().State.Running != nil
}

func (p *podStatus) String() string {
	c := p.container()
	state := "none"
	switch {
	case c.State.Running != nil:
		state = "running"
	case c.State.Terminated != nil:
		state = fmt.Sprintf("terminated %d %s", c.State.Terminated.ExitCode, c.State.Terminated.Reason)
	case c.State.Waiting != nil:
		state = fmt.Sprintf("waiting %s %s", c.State.Waiting.Reason, c.State.Waiting.Message)
	}
	return fmt.Sprintf("pod %s: phase %s, ready %v, container %s, restarts %d", p.Metadata.Name, p.Status.Phase, p.ready(), state,
		c.RestartCount)
}

// getPod reads a pod's status.
func (e *env) getPod(name string) (*podStatus, error) {
	out, err := e.cluster.Kubectl(context.Background(), nil, "get", "pod", name, "-o", "json")
	if err != nil {
		return nil, err
	}
	var p podStatus
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		return nil, fmt.Errorf("kubectl get pod %s: %w", name, err)
	}
	return &p, nil
}

// waitPod polls the pod until cond holds; it fails t after timeout.
func (e *env) waitPod(t *testing.T, name string, timeout time.Duration, what string, cond func(*podStatus) bool) *podStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last *podStatus
	err := testenv.Poll(ctx, 250*time.Millisecond, func() (bool, string) {
		p, err := e.getPod(name)
		if err != nil {
			return false, err.Error()
		}
		last = p
		return cond(p), p.String()
	})
	if err != nil {
		t.Fatalf("pod %s never %s: %v", name, what, err)
	}
	return last
}

func (e *env) waitReady(t *testing.T, name string) *podStatus {
	t.Helper()
	return e.waitPod(t, name, bootTimeout, "Ready", func(p *podStatus) bool { return p.running() && p.ready() })
}

// deletePod deletes a pod and waits until it is gone.
func (e *env) deletePod(t *testing.T, name string) {
	t.Helper()
	e.kubectl(t, "delete", "pod", name, "--wait=true", "--timeout=90s")
}

// stream is a kubectl command whose output is read while it runs (logs -f,
// attach -i); stop ends it (by its pid: only this process).
type stream struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser

	mu   sync.Mutex
	out  bytes.Buffer // guarded by mu
	done chan struct{}
}

// startStream starts kubectl with args; with stdin, its stdin is a pipe
// the test writes to with send.
func (e *env) startStream(t *testing.T, stdin bool, args ...string) *stream {
	t.Helper()
	s := &stream{cmd: e.cluster.KubectlCmd(context.Background(), args...), done: make(chan struct{})}
	if stdin {
		w, err := s.cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		s.stdin = w
	}
	r, err := s.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s.cmd.Stderr = &lockedWriter{s: s}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		br := bufio.NewReader(r)
		buf := make([]byte, 4096)
		for {
			n, err := br.Read(buf)
			s.mu.Lock()
			s.out.Write(buf[:n])
			s.mu.Unlock()
			if err != nil {
				break
			}
		}
		_ = s.cmd.Wait()
		close(s.done)
	}()
	t.Cleanup(s.stop)
	return s
}

type lockedWriter struct{ s *stream }

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	return w.s.out.Write(b)
}

func (s *stream) output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.String()
}

// send writes a line to the command's stdin.
func (s *stream) send(t *testing.T, line string) {
	t.Helper()
	if _, err := io.WriteString(s.stdin, line+"\n"); err != nil {
		t.Fatalf("write to %s: %v", strings.Join(s.cmd.Args[1:], " "), err)
	}
}

// sendUntil sends line every interval until the output holds want (a
// guest's shell may not read its console yet), for at most timeout.
func (s *stream) sendUntil(t *testing.T, line, want string, interval, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(s.output(), want) && time.Now().Before(deadline) {
		s.send(t, line)
		time.Sleep(interval)
	}
	s.waitFor(t, want, interval)
}

// waitFor waits until the output holds want, and returns the output.
func (s *stream) waitFor(t *testing.T, want string, timeout time.Duration) string {
	t.Helper()
	return s.waitMatch(t, fmt.Sprintf("%q", want), timeout, func(out string) (string, bool) {
		return out, strings.Contains(out, want)
	})
}

// waitLine waits for a whole output line (ended by a newline) holding
// prefix, and returns the line from prefix on: on a console, a line the
// guest prints may follow the shell's prompt.
func (s *stream) waitLine(t *testing.T, prefix string, timeout time.Duration) string {
	t.Helper()
	return s.waitMatch(t, fmt.Sprintf("line with %q", prefix), timeout, func(out string) (string, bool) {
		for {
			line, rest, complete := strings.Cut(out, "\n")
			if !complete {
				return "", false
			}
			if i := strings.Index(line, prefix); i >= 0 {
				return strings.TrimRight(line[i:], "\r"), true
			}
			out = rest
		}
	})
}

// waitMatch waits until match finds what it looks for (described by what)
// in the output, and returns what match returned.
func (s *stream) waitMatch(t *testing.T, what string, timeout time.Duration, match func(out string) (string, bool)) string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		if m, ok := match(s.output()); ok {
			return m
		}
		select {
		case <-deadline:
			t.Fatalf("%s: no %s within %s; output:\n%s", strings.Join(s.cmd.Args[1:], " "), what, timeout, testenv.Tail(s.output(), 30))
		case <-s.done:
			if m, ok := match(s.output()); ok {
				return m
			}
			t.Fatalf("%s ended (%v) without %s; output:\n%s", strings.Join(s.cmd.Args[1:], " "), s.cmd.ProcessState, what,
				testenv.Tail(s.output(), 30))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// stop ends the command if it still runs and waits for it.
func (s *stream) stop() {
	select {
	case <-s.done:
		return
	default:
	}
	if s.stdin != nil {
		_ = s.stdin.Close()
	}
	_ = s.cmd.Process.Kill()
	<-s.done
}

// echo connects to addr, sends a line and expects it back.
func echo(addr, line string) error {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err = io.WriteString(conn, line+"\n"); err != nil {
		return err
	}
	got, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return fmt.Errorf("echo from %s: %w", addr, err)
	}
	if strings.TrimSpace(got) != line {
		return fmt.Errorf("echo from %s: %q, want %q", addr, got, line)
	}
	return nil
}

// waitEcho retries echo until it works or timeout passes.
func waitEcho(t *testing.T, addr, line string, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := testenv.Poll(ctx, 500*time.Millisecond, func() (bool, string) {
		err := echo(addr, line)
		return err == nil, fmt.Sprint(err)
	}); err != nil {
		t.Fatalf("%s does not echo: %v", addr, err)
	}
}

// vmDomain returns the libvirt domain of the pod's VM: the one whose
// definition names the pod's uid.
func (e *env) vmDomain(t *testing.T, uid string) string {
	t.Helper()
	// An integration run beside this one may be restarting libvirtd (its
	// fault tests do): wait for it, as the shim does.
	ctx, cancel := context.WithTimeout(context.Background(), shortTimeout)
	defer cancel()
	var l *libvirt.Libvirt
	if err := testenv.Poll(ctx, 500*time.Millisecond, func() (bool, string) {
		var err error
		l, err = testenv.ConnectLibvirt()
		return err == nil, fmt.Sprint(err)
	}); err != nil {
		t.Fatal(err)
	}
	defer l.Disconnect()
	doms, err := testenv.DomainsMentioning(l, e.ctd.ShimStateDir)
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, name := range doms {
		d, err := l.DomainLookupByName(name)
		if err != nil {
			continue
		}
		xml, err := l.DomainGetXMLDesc(d, 0)
		if err == nil && strings.Contains(xml, uid) {
			found = append(found, name)
		}
	}
	if len(found) != 1 {
		t.Fatalf("libvirt domains of pod uid %s: %v, want one", uid, found)
	}
	return found[0]
}
