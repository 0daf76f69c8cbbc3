package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
)

// microPackages are the packages whose Go benchmarks section 5 runs.
var microPackages = []string{"./vm/", "./configdrive/", "./numa/", "./bench/micro/"}

// microResult is section 5: `go test -bench` output and its medians.
type microResult struct {
	Command    string           `json:"command"`
	Output     string           `json:"output"` // benchstat's input format
	Benchmarks []microBenchmark `json:"benchmarks"`
	// Empty lists the packages that have no benchmark of their own.
	Empty []string `json:"packages_without_benchmarks,omitempty"`
}

// microBenchmark is one benchmark's median over the -count runs.
type microBenchmark struct {
	Package string             `json:"package"`
	Name    string             `json:"name"`
	Runs    int                `json:"runs"`
	Median  map[string]float64 `json:"median"` // by unit: ns/op, B/op, allocs/op, ...
}

func runMicro(ctx context.Context, c *config) (*microResult, error) {
	args := []string{"test", "-run", "^$", "-bench", ".", "-benchmem",
		"-count", strconv.Itoa(c.microCount), "-benchtime", c.microTime}
	args = append(args, microPackages...)
	res := &microResult{Command: "go " + strings.Join(args, " ")}
	logf("micro: %s", res.Command)
	cmd := exec.CommandContext(ctx, "go", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	res.Output = string(out)
	if err != nil {
		return res, fmt.Errorf("%s: %v\n%s%s", res.Command, err, out, stderr.Bytes())
	}
	res.Benchmarks, res.Empty = parseBench(res.Output)
	if len(res.Benchmarks) == 0 {
		return res, fmt.Errorf("%s printed no benchmark results:\n%s", res.Command, out)
	}
	return res, nil
}

// parseBench reads `go test -bench` output: "pkg:" lines name the package
// of the benchmark lines after them; "ok <pkg>" closes it. It returns the
// per-benchmark medians in order of appearance and the packages that ran
// no benchmark.
func parseBench(out string) ([]microBenchmark, []string) {
	type key struct{ pkg, name string }
	samples := map[key]map[string][]float64{}
	var order []key
	pkg := ""
	seen := map[string]bool{}
	var empty []string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		switch {
		case strings.HasPrefix(line, "pkg: "):
			pkg = strings.TrimPrefix(line, "pkg: ")
		case len(f) >= 2 && f[0] == "ok":
			if !seen[f[1]] {
				empty = append(empty, f[1])
			}
			pkg = ""
		case len(f) >= 4 && strings.HasPrefix(f[0], "Benchmark") && pkg != "":
			seen[pkg] = true
			name := f[0]
			if i := strings.LastIndex(name, "-"); i > 0 {
				if _, err := strconv.Atoi(name[i+1:]); err == nil {
					name = name[:i] // the GOMAXPROCS suffix
				}
			}
			k := key{pkg, name}
			if samples[k] == nil {
				samples[k] = map[string][]float64{}
				order = append(order, k)
			}
			for i := 2; i+1 < len(f); i += 2 {
				v, err := strconv.ParseFloat(f[i], 64)
				if err != nil {
					break
				}
				samples[k][f[i+1]] = append(samples[k][f[i+1]], v)
			}
		}
	}
	var res []microBenchmark
	for _, k := range order {
		b := microBenchmark{Package: k.pkg, Name: k.name, Median: map[string]float64{}}
		for unit, v := range samples[k] {
			slices.Sort(v)
			b.Median[unit] = quantile(v, 0.5)
			b.Runs = max(b.Runs, len(v))
		}
		res = append(res, b)
	}
	return res, empty
}
