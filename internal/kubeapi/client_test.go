package kubeapi

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
)

func TestTokenAndErrors(t *testing.T) {
	var auth []string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth = append(auth, r.Header.Get("Authorization"))
		if r.URL.Path == "/api/v1/nodes/gone" {
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"kind":"Status","code":404,"reason":"NotFound","message":"nodes \"gone\" not found"}`))
			return
		}
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(`{"kind":"Status","code":403,"reason":"Forbidden","message":"cannot patch nodes"}`))
	}))
	defer srv.Close()
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("one\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &Client{Server: srv.URL, HTTP: srv.Client(), TokenFile: tok}
	_, err := c.GetNode(context.Background(), "gone")
	if !errors.Is(err, errdefs.ErrNotFound) || err.Error() != `GET /api/v1/nodes/gone: 404 NotFound: nodes "gone" not found` {
		t.Fatalf("GetNode: %v", err)
	}
	// kubelet rotates the token: each request reads it again.
	if err := os.WriteFile(tok, []byte("two"), 0o600); err != nil {
		t.Fatal(err)
	}
	v := "ready"
	if err := c.SetNodeLabel(context.Background(), "n", "k", &v); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Fatalf("SetNodeLabel: %v", err)
	}
	if len(auth) != 2 || auth[0] != "Bearer one" || auth[1] != "Bearer two" {
		t.Fatalf("Authorization headers %q", auth)
	}
}
