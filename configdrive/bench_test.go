package configdrive

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// BenchmarkBuildVFAT is one typical vfat drive (keys, user-data, meta,
// dual-stack network): what the VM create path spends on the config drive.
func BenchmarkBuildVFAT(b *testing.B) { benchmarkBuild(b, FormatVFAT) }

// BenchmarkBuildISO9660 is the same drive as iso9660.
func BenchmarkBuildISO9660(b *testing.B) { benchmarkBuild(b, FormatISO9660) }

func benchmarkBuild(b *testing.B, f Format) {
	requireFormatTools(b, f)
	dir := b.TempDir()
	opts := testOptions(b)
	opts.Format = f
	inst, network := testInstance(), testNetwork(b)
	out := filepath.Join(dir, "drive.img")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := (Drive{Dir: dir, Out: out, Instance: inst, Network: network, Options: opts}).Build(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRender is the in-process part: both JSON documents and the file list.
func BenchmarkRender(b *testing.B) {
	inst, network, opts := testInstance(), testNetwork(b), testOptions(b)
	seed := make([]byte, randomSeedLen)
	for i := 0; i < b.N; i++ {
		if _, err := render(inst, network, opts, seed); err != nil {
			b.Fatal(err)
		}
	}
}

func requireFormatTools(t testing.TB, f Format) {
	t.Helper()
	if f == FormatVFAT {
		requireTools(t, "mkfs.vfat", "mcopy")
		return
	}
	if _, _, err := isoTool(); err != nil {
		t.Skipf("%v (Debian: apt-get install genisoimage)", err)
	}
}

// TestBuildLatency builds the typical drive 100 times in each format and
// prints p50/p99 (go test -run TestBuildLatency -v ./configdrive/). It
// reports, it never fails on timing; -short skips it.
func TestBuildLatency(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: latency figures skipped")
	}
	const n = 100
	for _, f := range []Format{FormatVFAT, FormatISO9660} {
		t.Run(string(f), func(t *testing.T) {
			requireFormatTools(t, f)
			dir := t.TempDir()
			opts := testOptions(t)
			opts.Format = f
			inst, network := testInstance(), testNetwork(t)
			out := filepath.Join(dir, "drive.img")
			d := make([]time.Duration, 0, n)
			for i := 0; i < n; i++ {
				start := time.Now()
				if err := (Drive{Dir: dir, Out: out, Instance: inst, Network: network, Options: opts}).Build(context.Background()); err != nil {
					t.Fatal(err)
				}
				d = append(d, time.Since(start))
			}
			slices.Sort(d)
			ms := func(x time.Duration) float64 { return float64(x.Microseconds()) / 1000 }
			t.Logf("Build %s, %d builds: p50 %.1f ms, p99 %.1f ms, min %.1f ms, max %.1f ms",
				f, n, ms(d[n/2-1]), ms(d[n*99/100-1]), ms(d[0]), ms(d[n-1]))
		})
	}
}
