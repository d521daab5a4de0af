package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// serverTLS is the gRPC listener's TLS: its certificate and key, and the
// CAs that verify clients' certificates (mutual TLS) when set.
type serverTLS struct {
	cert, key, clientCA string
}

// on reports whether the gRPC listener serves TLS.
func (t serverTLS) on() bool { return t.cert != "" }

// check reports a flag that is missing: a certificate needs its key and
// the key its certificate, and client CAs need both.
func (t serverTLS) check() error {
	switch {
	case t.cert != "" && t.key == "":
		return errors.New("--grpc-tls-cert needs --grpc-tls-key")
	case t.key != "" && t.cert == "":
		return errors.New("--grpc-tls-key needs --grpc-tls-cert")
	case t.clientCA != "" && t.cert == "":
		return errors.New("--grpc-tls-client-ca needs --grpc-tls-cert and --grpc-tls-key")
	}
	return nil
}

// config returns the listener's tls.Config. The certificate and key are
// read now, and again at a handshake once either file's modification time
// has changed, so that a renewed certificate (a cert-manager Secret, say)
// is served without a restart; a pair that cannot be read then is logged,
// and the last good one served. The client CAs are read once.
func (t serverTLS) config(log *slog.Logger) (*tls.Config, error) {
	r := &certReloader{cert: t.cert, key: t.key, log: log}
	if _, err := r.load(); err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: r.get}
	if t.clientCA != "" {
		pem, err := os.ReadFile(t.clientCA)
		if err != nil {
			return nil, fmt.Errorf("--grpc-tls-client-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--grpc-tls-client-ca %s: no PEM certificate in it", t.clientCA)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// certReloader serves a certificate and key from their files, read again
// when either changes.
type certReloader struct {
	cert, key string
	log       *slog.Logger

	mu     sync.Mutex
	pair   *tls.Certificate
	stamp  [2]time.Time // the files' modification times pair was read at
	failed [2]time.Time // the times a read failed at, logged once
}

// load reads the pair, and serves it from now on; it fails with an error
// that names the flag.
func (r *certReloader) load() (*tls.Certificate, error) {
	stamp, err := r.stamps()
	if err != nil {
		return nil, err
	}
	pair, err := tls.LoadX509KeyPair(r.cert, r.key)
	if err != nil {
		return nil, fmt.Errorf("--grpc-tls-cert %s, --grpc-tls-key %s: %w", r.cert, r.key, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pair, r.stamp = &pair, stamp
	return &pair, nil
}

// stamps returns the files' modification times.
func (r *certReloader) stamps() ([2]time.Time, error) {
	var stamp [2]time.Time
	for i, f := range []struct{ flag, path string }{{"--grpc-tls-cert", r.cert}, {"--grpc-tls-key", r.key}} {
		fi, err := os.Stat(f.path)
		if err != nil {
			return stamp, fmt.Errorf("%s: %w", f.flag, err)
		}
		stamp[i] = fi.ModTime()
	}
	return stamp, nil
}

// get is the tls.Config's GetCertificate: the pair, read again first if
// its files have changed since.
func (r *certReloader) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	stamp, err := r.stamps()
	r.mu.Lock()
	changed := err == nil && stamp != r.stamp && stamp != r.failed
	pair := r.pair
	r.mu.Unlock()
	if !changed {
		return pair, nil
	}
	loaded, err := r.load()
	if err != nil {
		r.mu.Lock()
		r.failed = stamp
		r.mu.Unlock()
		r.log.Error("sluice-server: the gRPC TLS certificate could not be read again; serving the last one", "err", err)
		return pair, nil
	}
	r.log.Info("sluice-server: the gRPC TLS certificate was read again", "cert", r.cert)
	return loaded, nil
}
