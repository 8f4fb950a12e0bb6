package browsertest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// Certificate returns the self-signed certificate that NewTLSServer serves
// and that every browser of this package trusts. It is made once per
// process, for 127.0.0.1, ::1, localhost and *.localhost; its Leaf is set.
func Certificate() (tls.Certificate, error) { return certificate() }

var certificate = sync.OnceValues(newCertificate)

// newCertificate makes a self-signed certificate for the loopback names.
func newCertificate() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "browsertest"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		DNSNames:              []string{"localhost", "*.localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// SPKIHash is the form --ignore-certificate-errors-spki-list takes: the
// base64 of the SHA-256 of the certificate's SubjectPublicKeyInfo.
func SPKIHash(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return base64.StdEncoding.EncodeToString(sum[:])
}

// NewTLSServer starts an https server on 127.0.0.1 for h with Certificate,
// speaking HTTP/2 and HTTP/1.1 as a browser's server would, and closes it
// when the test ends. Its URL is https://127.0.0.1:port; its Client trusts
// the certificate.
func NewTLSServer(tb testing.TB, h http.Handler) *httptest.Server {
	tb.Helper()
	cert, err := Certificate()
	if err != nil {
		tb.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	tb.Cleanup(srv.Close)
	return srv
}
