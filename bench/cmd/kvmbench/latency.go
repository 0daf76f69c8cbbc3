package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/digitalocean/go-libvirt"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

const (
	bootTimeout    = 2 * time.Minute
	runningTimeout = 2 * time.Minute
	goneTimeout    = 30 * time.Second
	statusPoll     = 5 * time.Millisecond
)

// pathResult is every sample of one way of starting the same VM.
type pathResult struct {
	Key     string `json:"key"`     // "raw", "ctr-1.6", "cri-2.x", ...
	Label   string `json:"label"`   // what the table calls it
	Flavour string `json:"flavour"` // containerd flavour; "" for the baseline
	// StartMs: from the first call until the task (or domain) is RUNNING.
	StartMs []float64 `json:"start_ms"`
	// FirstLineMs and ReadyMs: from the same start until the guest's first
	// console line and its userspace's ready line.
	FirstLineMs []float64 `json:"first_line_ms"`
	ReadyMs     []float64 `json:"ready_ms"`
	// PhasesMs splits StartMs: for CRI the three calls, for ctr the moment
	// `ctr run -d` exited, for the baseline define and create.
	PhasesMs map[string][]float64 `json:"phases_ms"`
	// PartsMs splits StartMs of a VM path by the shim's own log lines:
	// before, inside, between and after its Create and Start (startPartNames).
	PartsMs  map[string][]float64 `json:"parts_ms,omitempty"`
	Failures []string             `json:"failures,omitempty"`
	// Reference marks a path that starts no VM: `ctr run -d` of the pause
	// image with runc, what containerd and ctr cost around any runtime.
	Reference bool `json:"reference,omitempty"`
}

func (p *pathResult) phase(name string, d time.Duration) {
	if p.PhasesMs == nil {
		p.PhasesMs = map[string][]float64{}
	}
	p.PhasesMs[name] = append(p.PhasesMs[name], ms(d))
}

// latencyResults are sections 1 and 2.
type latencyResults struct {
	Runs   int `json:"runs"`
	Warmup int `json:"warmup"`
	// Template is the domain XML the baseline defines: the shim's own
	// (inactive) XML of a ctr-started VM, renamed, with fresh paths.
	Template string        `json:"baseline_domain_xml"`
	Paths    []*pathResult `json:"paths"`
	// ShimSteps: the shim's own time inside Create and Start, per flavour.
	ShimSteps []shimSteps `json:"shim_steps,omitempty"`
}

// baseline defines and creates the shim's domain XML with go-libvirt
// directly, on one connection kept open (as a long-lived agent would).
type baseline struct {
	l        *libvirt.Libvirt
	template *domainTemplate
	rawDir   string
}

// runLatency measures sections 1 and 2: per iteration, every path once,
// interleaved so that drift of the host affects all alike.
func runLatency(ctx context.Context, e *env) (*latencyResults, error) {
	res := &latencyResults{Runs: e.cfg.runs, Warmup: e.cfg.warmup}
	first := e.daemons[0]
	l, err := testenv.ConnectLibvirt()
	if err != nil {
		return nil, err
	}
	defer l.Disconnect()

	// The template: the shim defines the VM, we take its XML.
	logf("latency: capturing the shim's domain XML from a ctr run on containerd %s", first.name())
	bl, err := captureTemplate(ctx, l, first, e.rawDir)
	if err != nil {
		return nil, fmt.Errorf("capture the shim's domain XML: %w", err)
	}
	res.Template = bl.template.xml

	raw := &pathResult{Key: "raw", Label: "go-libvirt define+create (baseline)"}
	type step struct {
		p   *pathResult
		run func(i int, p *pathResult) error
	}
	steps := []step{{raw, func(i int, p *pathResult) error { return bl.run(ctx, i, p) }}}
	for _, d := range e.daemons {
		ctrP := &pathResult{Key: "ctr-" + d.name(), Label: "ctr run -d, containerd " + d.name(), Flavour: d.name()}
		criP := &pathResult{Key: "cri-" + d.name(), Label: "CRI sandbox+create+start, containerd " + d.name(), Flavour: d.name()}
		runcP := &pathResult{Key: "ctr-runc-" + d.name(), Label: "reference: ctr run -d of the pause image with runc, containerd " + d.name(),
			Flavour: d.name(), Reference: true}
		steps = append(steps,
			step{ctrP, func(i int, p *pathResult) error { return ctrRun(ctx, d, i, p) }},
			step{criP, func(i int, p *pathResult) error { return criRun(ctx, d, i, p) }},
			step{runcP, func(i int, p *pathResult) error { return ctrRunRunc(ctx, d, i, p) }})
	}
	for _, s := range steps {
		res.Paths = append(res.Paths, s.p)
	}

	total := e.cfg.warmup + e.cfg.runs
	for i := 0; i < total; i++ {
		logf("latency: iteration %d/%d%s", i+1, total, map[bool]string{true: " (warm-up, not counted)"}[i < e.cfg.warmup])
		for _, s := range steps {
			sink := s.p
			if i < e.cfg.warmup {
				sink = &pathResult{}
			}
			if err := s.run(i, sink); err != nil {
				logf("latency: %s run %d failed: %v", s.p.Key, i, err)
				s.p.Failures = append(s.p.Failures, fmt.Sprintf("run %d: %v", i, err))
				for _, d := range e.daemons {
					if left := d.ForceCleanup(ctx); len(left) > 0 {
						logf("latency: removed after the failure: %s", strings.Join(left, "; "))
					}
				}
			}
		}
	}
	for _, d := range e.daemons {
		if left := d.WaitNothingLeft(ctx, goneTimeout); len(left) > 0 {
			return res, fmt.Errorf("containerd %s: left after the latency runs: %s", d.name(), strings.Join(left, "; "))
		}
		if b, err := os.ReadFile(d.LogPath); err == nil {
			res.ShimSteps = append(res.ShimSteps, shimStepTimes(d.name(), string(b)))
		}
	}
	return res, nil
}

// shimSteps are the shim's own step times, as it logs them at the end of
// every VM Create ("defined VM") and Start ("started VM"), over every VM
// of a containerd's run (warm-up and the template capture included).
type shimSteps struct {
	Flavour string               `json:"flavour"`
	Create  map[string][]float64 `json:"create_ms"`
	Start   map[string][]float64 `json:"start_ms"`
}

var (
	// shimEndLine matches the shim's "defined VM" and "started VM" lines
	// in containerd's log: when each was written, which one, and its
	// took= steps.
	shimEndLine = regexp.MustCompile(`(?m)^time="([^"]+)".*msg="(defined|started) VM".*took="([^"]*)"`)
	shimStep    = regexp.MustCompile(`([a-z_]+)=([0-9.]+)ms`)
)

// stepTimes parses a took= value ("checks=0.0ms ... total=17.0ms") into
// milliseconds per step.
func stepTimes(took string) map[string]float64 {
	out := map[string]float64{}
	for _, st := range shimStep.FindAllStringSubmatch(took, -1) {
		if v, err := strconv.ParseFloat(st[2], 64); err == nil {
			out[st[1]] = v
		}
	}
	return out
}

// shimStepTimes collects the step times from a containerd log.
func shimStepTimes(flavour, log string) shimSteps {
	out := shimSteps{Flavour: flavour, Create: map[string][]float64{}, Start: map[string][]float64{}}
	for _, m := range shimEndLine.FindAllStringSubmatch(log, -1) {
		dst := out.Create
		if m[2] == "started" {
			dst = out.Start
		}
		for step, v := range stepTimes(m[3]) {
			dst[step] = append(dst[step], v)
		}
	}
	return out
}

// ctrRun: `ctr run -d` of the VM until the task is RUNNING, then the boot,
// then kill and delete.
func ctrRun(ctx context.Context, d *daemon, i int, p *pathResult) error {
	return ctrTimed(ctx, d, p, ctrRunArgs{id: fmt.Sprintf("lat-%d", i), boot: true,
		args: []string{"--runtime", testenv.RuntimeKVM, "--runtime-config-path", d.ShimConfigPath, d.kernelRef}})
}

// ctrRunRunc: `ctr run -d` of the pause image with containerd's runc shim
// until the task is RUNNING, then kill and delete. No VM: it shows what
// containerd and ctr cost around any runtime on this host.
func ctrRunRunc(ctx context.Context, d *daemon, i int, p *pathResult) error {
	return ctrTimed(ctx, d, p, ctrRunArgs{id: fmt.Sprintf("lat-runc-%d", i),
		args: []string{"--runtime", "io.containerd.runc.v2", d.pauseRef}})
}

// ctrRunArgs is one timed `ctr run -d <args> <id>`; boot: of a VM, whose
// console is timed until userspace.
type ctrRunArgs struct {
	id   string
	boot bool
	args []string
}

// ctrTimed times `ctr run -d <args> <id>` until the task is RUNNING, and
// with boot the guest's console until userspace; then the task and the
// container are removed. The times go to p.
func ctrTimed(ctx context.Context, d *daemon, p *pathResult, run ctrRunArgs) (retErr error) {
	id, boot, args := run.id, run.boot, run.args
	tasks, err := d.DialTasks()
	if err != nil {
		return err
	}
	defer tasks.Close()
	defer func() {
		if err := ctrRemove(ctx, d, tasks, id); err != nil && retErr == nil {
			retErr = err
		}
	}()

	offset := logSize(d.LogPath)
	t0 := time.Now()
	r := d.Ctr(ctx, testenv.NamespaceDefault, append(append([]string{"run", "-d"}, args...), id)...)
	exited := time.Since(t0)
	if r.Err != nil {
		return fmt.Errorf("%v", r)
	}
	if err := waitTask(ctx, tasks, id, "RUNNING"); err != nil {
		return err
	}
	start := time.Since(t0)
	if boot {
		bt, err := bootWatch(ctx, t0, shimConsole(d.ShimStateDir))
		if err != nil {
			return err
		}
		p.FirstLineMs = append(p.FirstLineMs, ms(bt.FirstLine))
		p.ReadyMs = append(p.ReadyMs, ms(bt.Ready))
		addStartParts(p, d.LogPath, offset, t0, t0.Add(start))
	}
	p.StartMs = append(p.StartMs, ms(start))
	p.phase("ctr_exited", exited)
	return nil
}

func bootWatch(ctx context.Context, t0 time.Time, locate func() string) (bootTimes, error) {
	ctx, cancel := context.WithTimeout(ctx, bootTimeout)
	defer cancel()
	return watchConsole(ctx, t0, locate)
}

func waitTask(ctx context.Context, tasks *testenv.Tasks, id, want string) error {
	ctx, cancel := context.WithTimeout(ctx, runningTimeout)
	defer cancel()
	return testenv.Poll(ctx, statusPoll, func() (bool, string) {
		st, _, err := tasks.Status(ctx, testenv.NamespaceDefault, id)
		if err != nil {
			return false, err.Error()
		}
		return st == want, fmt.Sprintf("task %s is %q, want %s", id, st, want)
	})
}

// ctrRemove kills (SIGKILL: the VM is destroyed) and deletes the task and
// the container, then waits until the shim and the domain are gone.
func ctrRemove(ctx context.Context, d *daemon, tasks *testenv.Tasks, id string) error {
	if st, _, _ := tasks.Status(ctx, testenv.NamespaceDefault, id); st != "" {
		if st != "STOPPED" {
			if r := d.Ctr(ctx, testenv.NamespaceDefault, "task", "kill", "-s", "KILL", id); r.Err != nil {
				return fmt.Errorf("%v", r)
			}
			if err := waitTask(ctx, tasks, id, "STOPPED"); err != nil {
				return err
			}
		}
		if r := d.Ctr(ctx, testenv.NamespaceDefault, "task", "delete", id); r.Err != nil {
			return fmt.Errorf("%v", r)
		}
	}
	if r := d.Ctr(ctx, testenv.NamespaceDefault, "containers", "delete", id); r.Err != nil &&
		!strings.Contains(r.Stderr, "not found") {
		return fmt.Errorf("%v", r)
	}
	return waitGone(ctx, d)
}

// waitGone waits until no shim process serves d and no domain of its shim
// exists.
func waitGone(ctx context.Context, d *daemon) error {
	l, err := testenv.ConnectLibvirt()
	if err != nil {
		return err
	}
	defer l.Disconnect()
	ctx, cancel := context.WithTimeout(ctx, goneTimeout)
	defer cancel()
	return testenv.Poll(ctx, 50*time.Millisecond, func() (bool, string) {
		doms, err := testenv.DomainsMentioning(l, d.ShimStateDir)
		if err != nil {
			return false, err.Error()
		}
		procs := d.ShimProcesses()
		return len(doms) == 0 && len(procs) == 0, fmt.Sprintf("domains %v, shim processes %v", doms, procs)
	})
}

// criRun: RunPodSandbox + CreateContainer + StartContainer until
// ContainerStatus is RUNNING, then the boot, then the pod is removed.
func criRun(ctx context.Context, d *daemon, i int, p *pathResult) (retErr error) {
	cl, err := d.DialCRI()
	if err != nil {
		return err
	}
	defer cl.Close()
	var pod *testenv.Pod
	defer func() {
		if pod != nil {
			if removePodErr := cl.RemovePod(ctx, pod.ID); removePodErr != nil && retErr == nil {
				retErr = removePodErr
			}
		}
		if waitGoneErr := waitGone(ctx, d); waitGoneErr != nil && retErr == nil {
			retErr = waitGoneErr
		}
	}()

	offset := logSize(d.LogPath)
	t0 := time.Now()
	pod, err = cl.RunPod(ctx, testenv.PodOptions{Name: fmt.Sprintf("lat-%d", i), Namespace: "kvmbench", Handler: "kvm"})
	if err != nil {
		return err
	}
	tPod := time.Since(t0)
	cid, err := cl.CreateContainer(ctx, pod, testenv.ContainerOptions{Name: "vm", Image: d.kernelRef})
	if err != nil {
		return err
	}
	tCreate := time.Since(t0)
	if err = cl.StartContainer(ctx, cid); err != nil {
		return err
	}
	tStart := time.Since(t0)
	wctx, cancel := context.WithTimeout(ctx, runningTimeout)
	defer cancel()
	if _, err = cl.WaitContainerState(wctx, cid, cri.ContainerState_CONTAINER_RUNNING, statusPoll); err != nil {
		return err
	}
	start := time.Since(t0)
	bt, err := bootWatch(ctx, t0, shimConsole(d.ShimStateDir))
	if err != nil {
		return err
	}
	p.StartMs = append(p.StartMs, ms(start))
	p.phase("run_pod_sandbox", tPod)
	p.phase("create_container", tCreate-tPod)
	p.phase("start_container", tStart-tCreate)
	p.FirstLineMs = append(p.FirstLineMs, ms(bt.FirstLine))
	p.ReadyMs = append(p.ReadyMs, ms(bt.Ready))
	addStartParts(p, d.LogPath, offset, t0, t0.Add(start))
	return nil
}

// captureTemplate starts a VM with ctr, takes the shim's inactive domain
// XML and copies the files it names (kernel, initrd, config drive) into
// rawDir, then removes the VM again.
func captureTemplate(ctx context.Context, l *libvirt.Libvirt, d *daemon, rawDir string) (_ *baseline, retErr error) {
	const id = "lat-template"
	tasks, err := d.DialTasks()
	if err != nil {
		return nil, err
	}
	defer tasks.Close()
	defer func() {
		if ctrRemoveErr := ctrRemove(ctx, d, tasks, id); ctrRemoveErr != nil && retErr == nil {
			retErr = ctrRemoveErr
		}
	}()
	if r := d.Ctr(ctx, testenv.NamespaceDefault, "run", "-d", "--runtime", testenv.RuntimeKVM,
		"--runtime-config-path", d.ShimConfigPath, d.kernelRef, id); r.Err != nil {
		return nil, fmt.Errorf("%v", r)
	}
	if err = waitTask(ctx, tasks, id, "RUNNING"); err != nil {
		return nil, err
	}
	x, err := onlyShimDomainXML(l, d)
	if err != nil {
		return nil, err
	}
	dom, vmDir, err := shimDomain(x)
	if err != nil {
		return nil, err
	}
	filesDir := filepath.Join(rawDir, "files")
	if err = copyVMFiles(vmDir, filesDir); err != nil {
		return nil, err
	}
	tmpl, err := baselineTemplate(dom, vmDir, filesDir, d.ShimStateDir)
	if err != nil {
		return nil, err
	}
	return &baseline{l: l, template: tmpl, rawDir: rawDir}, nil
}

// onlyShimDomainXML returns the inactive XML of the one domain of d's shim.
func onlyShimDomainXML(l *libvirt.Libvirt, d *daemon) (string, error) {
	doms, err := testenv.DomainsMentioning(l, d.ShimStateDir)
	if err != nil {
		return "", err
	}
	if len(doms) != 1 {
		return "", fmt.Errorf("want one domain of the shim, found %v", doms)
	}
	dom, err := l.DomainLookupByName(doms[0])
	if err != nil {
		return "", err
	}
	return l.DomainGetXMLDesc(dom, libvirt.DomainXMLInactive)
}

// run defines and creates one baseline domain until it is running, then
// waits for the boot, destroys and undefines it.
func (b *baseline) run(ctx context.Context, i int, p *pathResult) (retErr error) {
	name := fmt.Sprintf("kvmbench-raw-%d-%d", os.Getpid(), i)
	runDir := filepath.Join(b.rawDir, fmt.Sprintf("run-%d", i))
	if err := os.MkdirAll(runDir, 0o711); err != nil {
		return err
	}
	defer os.RemoveAll(runDir)
	xml, err := b.template.instance(name, newUUID(), runDir)
	if err != nil {
		return err
	}

	t0 := time.Now()
	dom, err := b.l.DomainDefineXML(xml)
	if err != nil {
		return fmt.Errorf("define: %w", err)
	}
	defer func() {
		_ = b.l.DomainDestroy(dom)
		if domainUndefineErr := b.l.DomainUndefine(dom); domainUndefineErr != nil && retErr == nil {
			retErr = fmt.Errorf("undefine %s: %w", name, domainUndefineErr)
		}
	}()
	tDefine := time.Since(t0)
	if err = b.l.DomainCreate(dom); err != nil {
		return fmt.Errorf("create: %w", err)
	}
	tCreate := time.Since(t0)
	state, _, err := b.l.DomainGetState(dom, 0)
	if err != nil {
		return err
	}
	if libvirt.DomainState(state) != libvirt.DomainRunning {
		return fmt.Errorf("domain %s is in state %d after create, want running", name, state)
	}
	start := time.Since(t0)
	logPath := filepath.Join(runDir, "console.log")
	bt, err := bootWatch(ctx, t0, func() string { return logPath })
	if err != nil {
		return err
	}
	p.StartMs = append(p.StartMs, ms(start))
	p.phase("define", tDefine)
	p.phase("create", tCreate-tDefine)
	p.FirstLineMs = append(p.FirstLineMs, ms(bt.FirstLine))
	p.ReadyMs = append(p.ReadyMs, ms(bt.Ready))
	return nil
}

func newUUID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(errors.New("no randomness: " + err.Error()))
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
