package kube

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"testing"
)

func TestPKI(t *testing.T) {
	dir := t.TempDir()
	nodeIP, svcIP := net.IPv4(10, 0, 0, 9), net.IPv4(10, 96, 0, 1)
	p, err := newPKI(dir, "node-1", nodeIP, svcIP)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(p.CA)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		t.Fatal("CA is not PEM")
	}
	cases := []struct {
		name  string
		pair  pair
		usage x509.ExtKeyUsage
		host  string // verified against the SANs of a serving certificate
		cn    string
		orgs  []string
	}{
		{"apiserver by IP", p.APIServer, x509.ExtKeyUsageServerAuth, "127.0.0.1", "kube-apiserver", nil},
		{"apiserver by service IP", p.APIServer, x509.ExtKeyUsageServerAuth, svcIP.String(), "kube-apiserver", nil},
		{"apiserver by name", p.APIServer, x509.ExtKeyUsageServerAuth, "kubernetes.default.svc", "kube-apiserver", nil},
		{"kubelet serving", p.KubeletServing, x509.ExtKeyUsageServerAuth, nodeIP.String(), "node-1", nil},
		{"kubelet client", p.Kubelet, x509.ExtKeyUsageClientAuth, "", "system:node:node-1", []string{"system:nodes"}},
		{"admin", p.Admin, x509.ExtKeyUsageClientAuth, "", "kvm-shim-e2e-admin", []string{"system:masters"}},
		{"kube-proxy", p.KubeProxy, x509.ExtKeyUsageClientAuth, "", "system:kube-proxy", nil},
	}
	for _, c := range cases {
		kp, pairErr := tls.LoadX509KeyPair(c.pair.Cert, c.pair.Key)
		if pairErr != nil {
			t.Fatalf("%s: %v", c.name, pairErr)
		}
		cert, certErr := x509.ParseCertificate(kp.Certificate[0])
		if certErr != nil {
			t.Fatal(certErr)
		}
		opts := x509.VerifyOptions{Roots: roots, DNSName: c.host, KeyUsages: []x509.ExtKeyUsage{c.usage}}
		if _, verifyErr := cert.Verify(opts); verifyErr != nil {
			t.Errorf("%s: %v", c.name, verifyErr)
		}
		if cert.Subject.CommonName != c.cn || len(cert.Subject.Organization) != len(c.orgs) ||
			(len(c.orgs) > 0 && cert.Subject.Organization[0] != c.orgs[0]) {
			t.Errorf("%s: subject %v, want CN %s O %v", c.name, cert.Subject, c.cn, c.orgs)
		}
	}
	if fi, statErr := os.Stat(p.ServiceAccountKey); statErr != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("service account key: %v %v", fi, statErr)
	}

	kc := filepath.Join(dir, "admin.kubeconfig")
	if err = writeKubeconfig(kc, "https://127.0.0.1:1", p.CA, p.Admin); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(kc)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil || got["current-context"] != "e2e" {
		t.Errorf("kubeconfig: %v %s", err, b)
	}
}
