package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/cmd/sluice-server/internal/rlstest"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
	pem  []byte
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "sluice test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// issue returns a certificate of serial for 127.0.0.1 (a server's, or a
// client's), signed by ca, and its key, in PEM.
func (ca *testCA) issue(t *testing.T, serial int64, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "sluice test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

func writeFile(t *testing.T, path string, data []byte, mtime time.Time) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, mtime, mtime); err != nil {
		t.Fatal(err)
	}
}

// servedSerial is the serial of the certificate the server at addr serves
// a new TLS connection.
func servedSerial(t *testing.T, addr string, cfg *tls.Config) int64 {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
}

// askOver asks the server at addr for a decision over a connection dialled
// with creds, and returns the call's error.
func askOver(t *testing.T, addr string, creds credentials.TransportCredentials) error {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = rlspb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, rlstest.Request("example", []string{"remote_address", "10.0.0.1"}))
	return err
}

// TestGRPCTLS serves gRPC over TLS: a client that trusts the CA is
// answered, a plaintext one is not; a renewed certificate is served on the
// next connection without a restart, and one that cannot be read leaves
// the last good one served. With a client CA, only a client with a
// certificate it signed is answered.
func TestGRPCTLS(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t)
	certFile, keyFile, caFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.crt")
	certPEM, keyPEM := ca.issue(t, 100, x509.ExtKeyUsageServerAuth)
	then := time.Now().Add(-time.Minute)
	writeFile(t, certFile, certPEM, then)
	writeFile(t, keyFile, keyPEM, then)
	writeFile(t, caFile, ca.pem, then)
	trusting := &tls.Config{RootCAs: ca.pool, NextProtos: []string{"h2"}}

	t.Run("TLS", func(t *testing.T) {
		s := start(t, defaults(t, "--grpc-tls-cert", certFile, "--grpc-tls-key", keyFile), nil)
		if err := askOver(t, s.grpc, credentials.NewTLS(trusting)); err != nil {
			t.Fatalf("a client that trusts the CA: %v", err)
		}
		if err := askOver(t, s.grpc, insecure.NewCredentials()); err == nil {
			t.Fatal("a plaintext client was answered")
		}
		if got := servedSerial(t, s.grpc, trusting); got != 100 {
			t.Fatalf("served certificate %d; want 100", got)
		}

		// Renewed: served on the next connection.
		certPEM, keyPEM := ca.issue(t, 101, x509.ExtKeyUsageServerAuth)
		now := time.Now()
		writeFile(t, certFile, certPEM, now)
		writeFile(t, keyFile, keyPEM, now)
		if got := servedSerial(t, s.grpc, trusting); got != 101 {
			t.Fatalf("served certificate %d after the renewal; want 101", got)
		}
		// A pair that cannot be read: the last good one stays served.
		writeFile(t, certFile, []byte("not a certificate"), now.Add(time.Second))
		if got := servedSerial(t, s.grpc, trusting); got != 101 {
			t.Fatalf("served certificate %d after a bad renewal; want 101, the last good one", got)
		}
		writeFile(t, certFile, certPEM, now) // as it was, for the mutual TLS test
	})

	t.Run("MutualTLS", func(t *testing.T) {
		s := start(t, defaults(t, "--grpc-tls-cert", certFile, "--grpc-tls-key", keyFile, "--grpc-tls-client-ca", caFile), nil)
		if err := askOver(t, s.grpc, credentials.NewTLS(trusting)); err == nil {
			t.Fatal("a client without a certificate was answered")
		}
		clientCert, clientKey := ca.issue(t, 200, x509.ExtKeyUsageClientAuth)
		pair, err := tls.X509KeyPair(clientCert, clientKey)
		if err != nil {
			t.Fatal(err)
		}
		withCert := trusting.Clone()
		withCert.Certificates = []tls.Certificate{pair}
		if err := askOver(t, s.grpc, credentials.NewTLS(withCert)); err != nil {
			t.Fatalf("a client with a certificate the CA signed: %v", err)
		}
		stranger := newTestCA(t)
		strangerCert, strangerKey := stranger.issue(t, 300, x509.ExtKeyUsageClientAuth)
		if pair, err = tls.X509KeyPair(strangerCert, strangerKey); err != nil {
			t.Fatal(err)
		}
		withCert.Certificates = []tls.Certificate{pair}
		if err := askOver(t, s.grpc, credentials.NewTLS(withCert)); err == nil {
			t.Fatal("a client with a certificate another CA signed was answered")
		}
	})

	t.Run("Flags", func(t *testing.T) {
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"--grpc-tls-cert", certFile}, "--grpc-tls-cert needs --grpc-tls-key"},
			{[]string{"--grpc-tls-key", keyFile}, "--grpc-tls-key needs --grpc-tls-cert"},
			{[]string{"--grpc-tls-client-ca", caFile}, "--grpc-tls-client-ca needs"},
		} {
			if _, err := parseFlags(c.args, io.Discard); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%v: got %v, want an error naming %s", c.args, err, c.want)
			}
		}
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"--grpc-tls-cert", filepath.Join(dir, "absent.crt"), "--grpc-tls-key", keyFile}, "--grpc-tls-cert"},
			{[]string{"--grpc-tls-cert", keyFile, "--grpc-tls-key", keyFile}, "--grpc-tls-cert"},
			{[]string{"--grpc-tls-cert", certFile, "--grpc-tls-key", keyFile, "--grpc-tls-client-ca", keyFile}, "--grpc-tls-client-ca"},
		} {
			err := run(t.Context(), defaults(t, append(c.args, "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0")...), slog.New(slog.DiscardHandler))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%v: got %v, want an error naming %s", c.args, err, c.want)
			}
		}
	})
}
