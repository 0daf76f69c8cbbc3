package kube

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pair is a certificate and its key on disk.
type pair struct{ Cert, Key string }

// ca is the cluster's one certificate authority: it signs every serving
// and client certificate, and every component trusts it for both.
type ca struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	path string // PEM of cert
}

// certSpec is one leaf certificate: its subject, SANs and usage.
type certSpec struct {
	file   string // base name below the PKI dir, without extension
	cn     string
	orgs   []string
	ips    []net.IP
	dns    []string
	server bool // serving (else client) certificate
}

func newSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

// newCA makes a self-signed CA valid for a day and writes ca.crt in dir.
func newCA(dir string) (*ca, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "kvm-shim-e2e-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	c := &ca{cert: cert, key: key, path: filepath.Join(dir, "ca.crt")}
	return c, writePEM(c.path, "CERTIFICATE", der)
}

// issue signs s and writes <file>.crt and <file>.key in dir.
func (c *ca) issue(dir string, s certSpec) (pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return pair{}, err
	}
	serial, err := newSerial()
	if err != nil {
		return pair{}, err
	}
	usage := x509.ExtKeyUsageClientAuth
	if s.server {
		usage = x509.ExtKeyUsageServerAuth
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: s.cn, Organization: s.orgs},
		NotBefore:    c.cert.NotBefore,
		NotAfter:     c.cert.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  s.ips,
		DNSNames:     s.dns,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		return pair{}, fmt.Errorf("sign certificate %s: %w", s.file, err)
	}
	p := pair{Cert: filepath.Join(dir, s.file+".crt"), Key: filepath.Join(dir, s.file+".key")}
	if err := writePEM(p.Cert, "CERTIFICATE", der); err != nil {
		return pair{}, err
	}
	return p, writeKey(p.Key, key)
}

// writeKey writes key as a PKCS#8 PEM file only root can read.
func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(path, "PRIVATE KEY", der)
}

func writePEM(path, typ string, der []byte) error {
	mode := os.FileMode(0o644)
	if typ == "PRIVATE KEY" {
		mode = 0o600
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode)
}

// PKI is every certificate and key of the cluster.
type PKI struct {
	CA                string
	APIServer         pair // serving: 127.0.0.1, the node IP, the kubernetes Service IP and names
	APIServerKubelet  pair // the apiserver's client certificate towards kubelet (system:masters)
	Admin             pair // kubectl (system:masters)
	ControllerManager pair // system:masters: it runs with its own identity for every controller
	Kubelet           pair // client: system:node:<node> in system:nodes
	KubeletServing    pair // serving: the node IP and name
	KubeProxy         pair // system:kube-proxy (bound to system:node-proxier)
	Scheduler         pair // system:kube-scheduler (bound to system:kube-scheduler)
	// ServiceAccountKey signs service account tokens (apiserver,
	// controller-manager); ServiceAccountPub verifies them.
	ServiceAccountKey, ServiceAccountPub string

	ca  *ca    // signs the certificates of further nodes (issueNode)
	dir string // where they go
}

// issueNode signs a kubelet's client certificate (system:node:<node> in
// system:nodes, which the Node authorizer and NodeRestriction key on) and
// its serving certificate (the node's IP and name), as files named after
// base.
func (p *PKI) issueNode(base, node string, ip net.IP) (client, serving pair, err error) {
	client, err = p.ca.issue(p.dir, certSpec{file: base + "-client", cn: "system:node:" + node, orgs: []string{"system:nodes"}})
	if err != nil {
		return pair{}, pair{}, err
	}
	serving, err = p.ca.issue(p.dir, certSpec{file: base + "-serving", cn: node, server: true, ips: []net.IP{ip}, dns: []string{node}})
	return client, serving, err
}

// newPKI writes the cluster's PKI into dir for a node named node at
// nodeIP, with the kubernetes Service at serviceIP.
func newPKI(dir, node string, nodeIP, serviceIP net.IP) (*PKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	c, err := newCA(dir)
	if err != nil {
		return nil, err
	}
	p := &PKI{CA: c.path, ca: c, dir: dir}
	loopback := net.IPv4(127, 0, 0, 1)
	specs := []struct {
		to   *pair
		spec certSpec
	}{
		{&p.APIServer, certSpec{file: "apiserver", cn: "kube-apiserver", server: true,
			ips: []net.IP{loopback, nodeIP, serviceIP},
			dns: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}}},
		{&p.APIServerKubelet, certSpec{file: "apiserver-kubelet-client", cn: "kube-apiserver-kubelet-client", orgs: []string{"system:masters"}}},
		{&p.Admin, certSpec{file: "admin", cn: "kvm-shim-e2e-admin", orgs: []string{"system:masters"}}},
		{&p.ControllerManager, certSpec{file: "controller-manager", cn: "system:kube-controller-manager", orgs: []string{"system:masters"}}},
		{&p.KubeProxy, certSpec{file: "kube-proxy", cn: "system:kube-proxy"}},
		{&p.Scheduler, certSpec{file: "scheduler", cn: "system:kube-scheduler"}},
	}
	for _, s := range specs {
		if *s.to, err = c.issue(dir, s.spec); err != nil {
			return nil, err
		}
	}
	if p.Kubelet, p.KubeletServing, err = p.issueNode("kubelet", node, nodeIP); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	p.ServiceAccountKey = filepath.Join(dir, "sa.key")
	p.ServiceAccountPub = filepath.Join(dir, "sa.pub")
	if err = writeKey(p.ServiceAccountKey, key); err != nil {
		return nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return nil, err
	}
	return p, writePEM(p.ServiceAccountPub, "PUBLIC KEY", pub)
}
