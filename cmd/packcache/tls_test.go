package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/packcache/packcache/internal/redistest"
)

// writeCert makes a certificate signed by parent (self-signed when parent
// is nil) and writes it and its key as PEM files in dir.
func writeCert(t *testing.T, dir, name string, tmpl *x509.Certificate, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, name+".pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(filepath.Join(dir, name+".key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// TestTLS connects to a redis-server that speaks only TLS and requires
// client certificates: --cacert, --cert and --key must all be used, and
// rediss:// URLs take them too.
func TestTLS(t *testing.T) {
	t.Parallel() // servers of its own
	redistest.RequireServer(t, "a TLS port")
	if ok, why := redistest.ServerHasTLS(); !ok {
		t.Skip("TLS test skipped: " + why)
	}
	dir := t.TempDir()
	now := time.Now()
	ca, caKey := writeCert(t, dir, "ca", &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "packcache test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}, nil, nil)
	writeCert(t, dir, "server", &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, ca, caKey)
	writeCert(t, dir, "client", &x509.Certificate{
		SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: "packcache"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ca, caKey)
	tlsAddr := closedAddr(t)
	_, tlsPort, _ := net.SplitHostPort(tlsAddr)
	f := func(name string) string { return filepath.Join(dir, name) }
	s := redistest.Start(t, "--tls-port", tlsPort, "--tls-cert-file", f("server.pem"), "--tls-key-file", f("server.key"),
		"--tls-ca-cert-file", f("ca.pem"), "--tls-auth-clients", "yes")
	redistest.RequireReal(t, s, "a TLS port")
	s.Client(t).Set(t.Context(), "tls:1", `{"over":"tls"}`, 0)

	client := []string{"--cert", f("client.pem"), "--key", f("client.key")}
	for _, c := range []struct {
		name string
		args []string
		ok   bool
		msg  string
	}{
		{"verified, client certificate", append([]string{"--addr", tlsAddr, "--cacert", f("ca.pem")}, client...), true, ""},
		{"rediss URL", append([]string{"--url", "rediss://" + tlsAddr, "--cacert", f("ca.pem")}, client...), true, ""},
		{"unverified", append([]string{"--addr", tlsAddr, "--insecure-skip-verify"}, client...), true, ""},
		{"unknown CA", append([]string{"--addr", tlsAddr, "--tls"}, client...), false, "certificate"},
		{"no client certificate", []string{"--addr", tlsAddr, "--cacert", f("ca.pem")}, false, "cannot reach Redis"},
		{"plain text to a TLS port", []string{"--addr", tlsAddr, "--timeout", "2s"}, false, "cannot reach Redis"},
		{"cert without key", []string{"--addr", tlsAddr, "--cert", f("client.pem")}, false, "--cert and --key go together"},
		{"bad CA file", []string{"--addr", tlsAddr, "--cacert", f("client.key")}, false, "no PEM certificate"},
	} {
		res := cli(t, append(c.args, "inspect", "tls:1")...)
		if ok := res.code == 0; ok != c.ok {
			t.Errorf("%s: exit %d", c.name, res.code)
		}
		if c.ok && !strings.Contains(res.stdout, `"over": "tls"`) {
			t.Errorf("%s: value not shown", c.name)
		}
		if !strings.Contains(res.stderr, c.msg) {
			t.Errorf("%s: stderr %q lacks %q", c.name, res.stderr, c.msg)
		}
	}
}
