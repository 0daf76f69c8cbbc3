// Command kvmbench measures the kvm shim on this machine against baselines:
// start latency (ctr and CRI against go-libvirt defining the same domain
// XML), time to guest userspace, shim memory against the runc shim,
// density (concurrent CRI pods), exec through the guest agent, storage on
// pod volumes against a raw libvirt domain, and the Go micro-benchmarks.
// It starts its
// own private containerd daemons (internal/testenv), prints one table and
// writes the results as JSON and Markdown under bench/results/.
//
// Run it as root from the repository root after hack/setup-host.sh,
// hack/guest/build.sh and make build:
//
//	go run ./bench/cmd/kvmbench            # the full run (about 15 minutes)
//	go run ./bench/cmd/kvmbench -quick     # a few iterations (about 8 minutes)
//	go run ./bench/cmd/kvmbench -rerender bench/results/X.json  # table and .md again
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/testenv"
)

// config is what the flags chose.
type config struct {
	flavours     []string
	sections     []string
	runs         int
	warmup       int
	memoryPods   []int
	densityPods  []int
	vcpus        int
	memoryMiB    int
	microCount   int
	microTime    string
	binDir       string
	imagesDir    string
	outDir       string
	keep         bool
	debug        bool
	waitQuiet    time.Duration
	netRuns      int
	netSeconds   int
	volumeVMs    int
	volumeMiB    int
	volumeOps    int
	volumeLoop   string
	eventsShims  []int
	eventsCount  int
	quick        bool
	commandLine  string
	writeResults bool
}

// allSections are the sections there are; defaultSections run without
// -sections. "net" (bench-net), "exec", "resources" and "events" run only
// when asked for.
var (
	allSections     = []string{"latency", "memory", "density", "micro", "net", "exec", "resources", "volumes", "events"}
	defaultSections = []string{"latency", "memory", "density", "volumes", "micro"}
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == "-rerender" {
		if err := rerender(os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, "kvmbench:", err)
			os.Exit(1)
		}
		return
	}
	c, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvmbench:", err)
		os.Exit(2)
	}
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "kvmbench: FAIL:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (*config, error) {
	fs := flag.NewFlagSet("kvmbench", flag.ContinueOnError)
	c := &config{commandLine: "go run ./bench/cmd/kvmbench " + strings.Join(args, " ")}
	flavours := fs.String("flavours", "1.6,2.x", "containerd flavours to start: 1.6 (Debian), 2.x (hack/setup-host.sh)")
	sections := fs.String("sections", strings.Join(defaultSections, ","), "sections to run, of: "+strings.Join(allSections, ", "))
	fs.IntVar(&c.runs, "runs", 10, "latency: measured runs of every start path")
	fs.IntVar(&c.warmup, "warmup", 1, "latency: warm-up runs of every path, not counted")
	memoryPods := fs.String("memory-pods", "1,10", "memory: pod counts")
	densityPods := fs.String("density-pods", "1,10,20", "density: concurrent pod counts")
	fs.IntVar(&c.vcpus, "vcpus", 1, "vCPUs of every guest")
	fs.IntVar(&c.memoryMiB, "memory-mib", 128, "memory of every guest, MiB")
	fs.IntVar(&c.netRuns, "net-runs", 5, "net: runs of every variant")
	fs.IntVar(&c.netSeconds, "net-seconds", 5, "net: iperf3 seconds per direction (the first is omitted)")
	fs.IntVar(&c.volumeVMs, "volume-vms", 4, "volumes: VMs per variant (each runs the workload 3 times)")
	fs.IntVar(&c.volumeMiB, "volume-mib", 256, "volumes: MiB written and read sequentially per run, and the span of the random 4 KiB I/O")
	fs.IntVar(&c.volumeOps, "volume-ops", 4000, "volumes: random 4 KiB reads and as many writes per run")
	fs.StringVar(&c.volumeLoop, "volume-loop", "direct",
		"volumes: the loop device's I/O to its file: direct (as a real block device, no host page cache) or buffered")
	eventsShims := fs.String("events-shims", "1,50", "events: idle pod shim counts (the first and last give the cost of one more shim)")
	fs.IntVar(&c.eventsCount, "events-count", 1000, "events: lifecycle events made per shim count (defined + undefined pairs)")
	fs.IntVar(&c.microCount, "micro-count", 6, "micro: go test -count")
	fs.StringVar(&c.microTime, "micro-benchtime", "1s", "micro: go test -benchtime")
	fs.StringVar(&c.binDir, "bin", "_output/bin", "directory with the built shim and emulator wrapper (make build)")
	fs.StringVar(&c.imagesDir, "images", "_output/images", "directory with the guest images (hack/guest/build.sh)")
	fs.StringVar(&c.outDir, "out", "bench/results", "where results go; \"\" writes none")
	fs.BoolVar(&c.keep, "keep", false, "keep the work dir under /run (daemon logs, shim state)")
	fs.DurationVar(&c.waitQuiet, "wait-quiet", 0,
		"first wait up to this long until no other QEMU runs and the load is below 1 for 30 s (0: do not wait)")
	fs.BoolVar(&c.debug, "debug", false, "containerd and the shims log at debug level (slower; for finding out why)")
	fs.BoolVar(&c.quick, "quick", false,
		"a short run: -runs 3 -memory-pods 1,3 -density-pods 1,4 -micro-count 1 -micro-benchtime 200ms unless set")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if c.quick {
		quick := map[string]string{"runs": "3", "memory-pods": "1,3", "density-pods": "1,4", "micro-count": "1", "micro-benchtime": "200ms",
			"net-runs": "2", "net-seconds": "3", "volume-vms": "1"}
		for name, v := range quick {
			if !set[name] {
				if err := fs.Set(name, v); err != nil {
					return nil, err
				}
			}
		}
	}
	c.flavours = splitList(*flavours)
	c.sections = splitList(*sections)
	for _, s := range c.sections {
		if !slices.Contains(allSections, s) {
			return nil, fmt.Errorf("-sections: unknown section %q", s)
		}
	}
	var err error
	if c.memoryPods, err = intList(*memoryPods); err != nil {
		return nil, fmt.Errorf("-memory-pods: %w", err)
	}
	if c.densityPods, err = intList(*densityPods); err != nil {
		return nil, fmt.Errorf("-density-pods: %w", err)
	}
	if c.eventsShims, err = intList(*eventsShims); err != nil {
		return nil, fmt.Errorf("-events-shims: %w", err)
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	c.writeResults = c.outDir != ""
	return c, nil
}

// validate refuses flag values out of their ranges.
func (c *config) validate() error {
	if c.eventsCount < 2 {
		return errors.New("-events-count must be at least 2")
	}
	if c.netRuns < 1 || c.netSeconds < 2 {
		return errors.New("-net-runs must be at least 1 and -net-seconds at least 2")
	}
	if c.volumeLoop != "direct" && c.volumeLoop != "buffered" {
		return fmt.Errorf("-volume-loop %q: want direct or buffered", c.volumeLoop)
	}
	if c.volumeVMs < 1 || c.volumeMiB < 1 || c.volumeOps < 1 {
		return errors.New("-volume-vms, -volume-mib and -volume-ops must be at least 1")
	}
	if c.runs < 1 || c.warmup < 0 || c.vcpus < 1 || c.memoryMiB < 64 || c.microCount < 1 {
		return errors.New("-runs, -vcpus and -micro-count must be at least 1, -warmup at least 0, -memory-mib at least 64")
	}
	if len(c.flavours) == 0 && c.needsDaemons() {
		return errors.New("-flavours: none given")
	}
	return nil
}

func (c *config) has(section string) bool { return slices.Contains(c.sections, section) }

func (c *config) needsDaemons() bool {
	return c.has("latency") || c.has("memory") || c.has("density") || c.has("net") || c.has("exec") || c.has("resources") ||
		c.has("volumes") || c.has("events")
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func intList(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive whole number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func run(c *config) (retErr error) {
	if os.Geteuid() != 0 && c.needsDaemons() {
		return errors.New("must run as root (containerd, mounts, libvirt qemu:///system); -sections micro runs without")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	res := &results{Command: c.commandLine, Started: time.Now().UTC()}
	machine, err := machineFacts(ctx, c)
	if err != nil {
		return err
	}
	res.Machine = machine
	res.Settings = settingsOf(c)

	if c.needsDaemons() {
		if measureOnHostErr := measureOnHost(ctx, c, res); measureOnHostErr != nil {
			return measureOnHostErr
		}
	}
	if c.has("micro") && ctx.Err() == nil {
		res.Micro, err = runMicro(ctx, c)
		res.fail("micro", err)
	}
	res.Finished = time.Now().UTC()
	res.build()
	fmt.Print(res.table())
	if c.writeResults {
		paths, err := res.write(c.outDir)
		if err != nil {
			return err
		}
		logf("results: %s", strings.Join(paths, ", "))
	}
	if len(res.Failed) > 0 {
		return fmt.Errorf("%d section(s) failed: %s", len(res.Failed), strings.Join(res.Failed, "; "))
	}
	return nil
}

// measureOnHost runs the sections that need daemons and VMs: it takes the
// host lock, starts the daemons, watches what else runs on the host, and
// stops and checks everything before it returns.
func measureOnHost(ctx context.Context, c *config, res *results) (retErr error) {
	unlock, err := lockHost()
	if err != nil {
		return err
	}
	defer unlock()
	// Integration tests boot VMs and load the two cores for minutes: no
	// figure means anything while one runs, so wait for the suite's lock
	// and hold it to the end.
	unlockIT, err := testenv.LockHost(testenv.IntegrationLock)
	if err != nil {
		return err
	}
	defer unlockIT()
	if c.waitQuiet > 0 {
		logf("waiting up to %v for the host to go quiet", c.waitQuiet)
		if err = waitQuiet(ctx, c.waitQuiet, 30*time.Second); err != nil {
			if ctx.Err() != nil {
				return err
			}
			logf("%v; measuring anyway", err)
		}
		res.Machine.OtherQEMU, res.Machine.LoadAtStart = otherQEMU(""), fmt.Sprintf("%.2f", load1())
	}
	e, err := setup(ctx, c)
	defer func() {
		if closeErr := e.close(c.keep); closeErr != nil {
			retErr = errors.Join(retErr, closeErr)
		}
	}()
	stopMonitor := monitor(e.work)
	defer func() {
		d := stopMonitor()
		res.Disturbance = &d
	}()
	if err != nil {
		return err
	}
	for _, d := range e.daemons {
		v, versionErr := d.Version(ctx)
		if versionErr != nil {
			return versionErr
		}
		res.Machine.Containerd = append(res.Machine.Containerd, d.name()+": "+v)
	}
	runSections(ctx, c, e, res)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return nil
}

// runSections runs the sections c names that need daemons, in order,
// until ctx ends.
func runSections(ctx context.Context, c *config, e *env, res *results) {
	var err error
	// A failing section is reported and the next one still runs, so one
	// broken piece does not throw away the others' numbers.
	if c.has("latency") && ctx.Err() == nil {
		res.Latency, err = runLatency(ctx, e)
		res.fail("latency", err)
	}
	if c.has("memory") && ctx.Err() == nil {
		res.Memory, err = runMemory(ctx, e)
		res.fail("memory", err)
	}
	if c.has("density") && ctx.Err() == nil {
		res.Density, err = runDensity(ctx, e)
		res.fail("density", err)
	}
	if c.has("net") && ctx.Err() == nil {
		res.Net, err = runNet(ctx, e)
		res.fail("net", err)
	}
	if c.has("exec") && ctx.Err() == nil {
		res.Exec, err = runExec(ctx, e)
		res.fail("exec", err)
	}
	if c.has("resources") && ctx.Err() == nil {
		res.Resources, err = runResources(ctx, e)
		res.fail("resources", err)
	}
	if c.has("volumes") && ctx.Err() == nil {
		res.Volumes, err = runVolumes(ctx, e)
		res.fail("volumes", err)
	}
	if c.has("events") && ctx.Err() == nil {
		res.Events, err = runEvents(ctx, e)
		res.fail("events", err)
	}
}
