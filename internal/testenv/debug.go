package testenv

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
)

// goroutineTotal starts the first line of pprof's goroutine profile in its
// text form (debug=1): "goroutine profile: total 123".
const goroutineTotal = "goroutine profile: total "

// Goroutines counts the daemon's goroutines, read from the pprof endpoint
// containerd serves on its debug socket (the same in 1.6 and 2.x).
func (c *Containerd) Goroutines(ctx context.Context) (int, error) {
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", c.DebugAddress)
		},
	}}
	defer client.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://containerd/debug/pprof/goroutine?debug=1", nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("containerd %s debug socket: %w", c.Flavour.Name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("containerd %s goroutine profile: %s", c.Flavour.Name, resp.Status)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil {
		return 0, fmt.Errorf("containerd %s goroutine profile: %w", c.Flavour.Name, err)
	}
	return parseGoroutineTotal(line)
}

// parseGoroutineTotal reads the count from the goroutine profile's first line.
func parseGoroutineTotal(line string) (int, error) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(line), goroutineTotal)
	if !ok {
		return 0, fmt.Errorf("goroutine profile starts with %q, want %q", line, goroutineTotal)
	}
	return strconv.Atoi(rest)
}
