// Package kubeapi is the node installer's small typed client of the
// Kubernetes API: the five calls it makes (get a node, merge-patch its
// labels and its status's extended resource, list the pods bound to it,
// create an event) over HTTPS with the pod's service account. client-go
// would bring a few dozen modules into a static binary that needs these
// five requests only.
package kubeapi

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/errdefs"
)

// ServiceAccountDir is where kubelet mounts a pod's service account
// token and the cluster CA.
const ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// Client talks to one API server.
type Client struct {
	// Server is the API server's base URL, https://host:port.
	Server string
	// HTTP carries the requests (its transport trusts the cluster CA).
	HTTP *http.Client
	// TokenFile is re-read on every request: kubelet rotates it.
	TokenFile string
}

// InCluster builds a Client from the environment kubelet gives a pod:
// KUBERNETES_SERVICE_HOST/PORT and the service account directory.
func InCluster() (*Client, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, fmt.Errorf("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set (not in a pod?): %w",
			errdefs.ErrFailedPrecondition)
	}
	caPEM, err := os.ReadFile(filepath.Join(ServiceAccountDir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("cluster CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("cluster CA %s holds no certificate: %w", filepath.Join(ServiceAccountDir, "ca.crt"), errdefs.ErrInvalidArgument)
	}
	return &Client{
		Server: "https://" + net.JoinHostPort(host, port),
		HTTP: &http.Client{
			Timeout:   30 * time.Second,
			Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
		},
		TokenFile: filepath.Join(ServiceAccountDir, "token"),
	}, nil
}

// Status is an API error's body.
type Status struct {
	Code    int    `json:"code"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// Error is an API server's refusal of a request.
type Error struct {
	Method, Path string
	Status       Status
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s %s: %d %s: %s", e.Method, e.Path, e.Status.Code, e.Status.Reason, e.Status.Message)
}

// Unwrap classes the refusal as an errdefs error.
func (e *Error) Unwrap() error {
	switch e.Status.Code {
	case http.StatusNotFound:
		return errdefs.ErrNotFound
	case http.StatusConflict:
		return errdefs.ErrAlreadyExists
	case http.StatusUnauthorized, http.StatusForbidden:
		return errdefs.ErrPermissionDenied
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		return errdefs.ErrInvalidArgument
	}
	return errdefs.ErrUnavailable
}

// request is one API call.
type request struct {
	method, path string
	query        url.Values
	contentType  string
	body, out    any
}

func (c *Client) do(ctx context.Context, r request) error {
	var body io.Reader
	if r.body != nil {
		b, err := json.Marshal(r.body)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	u := strings.TrimSuffix(c.Server, "/") + r.path
	if len(r.query) > 0 {
		u += "?" + r.query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, r.method, u, body)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", r.contentType)
	}
	if c.TokenFile != "" {
		tok, terr := os.ReadFile(c.TokenFile)
		if terr != nil {
			return fmt.Errorf("service account token: %w", terr)
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", r.method, r.path, errors.Join(err, errdefs.ErrUnavailable))
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("%s %s: %w", r.method, r.path, err)
	}
	if resp.StatusCode/100 != 2 {
		e := &Error{Method: r.method, Path: r.path, Status: Status{Code: resp.StatusCode, Reason: resp.Status}}
		var st Status
		if json.Unmarshal(data, &st) == nil && st.Message != "" {
			e.Status.Reason, e.Status.Message = st.Reason, st.Message
		}
		return e
	}
	if r.out == nil {
		return nil
	}
	if err := json.Unmarshal(data, r.out); err != nil {
		return fmt.Errorf("%s %s: decode the answer: %w", r.method, r.path, err)
	}
	return nil
}
