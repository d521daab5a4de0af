package redisconn

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/redis/rueidis"
)

// TestRejects: a Server no client can be built of says why, naming the
// field, on either client, before it sends anything.
func TestRejects(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	addrs := []string{"127.0.0.1:1"}
	tests := []struct {
		name string
		s    Server
		want string
	}{
		{"NoAddrs", Server{}, "no Addrs"},
		{"ClusterAndSentinel", Server{Addrs: addrs, Cluster: true, Sentinel: "m"}, "both Cluster and Sentinel set"},
		{"CAFileMissing", Server{Addrs: addrs, TLS: &TLS{CAFile: filepath.Join(dir, "none.pem")}}, "TLS CAFile"},
		{"CAFileNotPEM", Server{Addrs: addrs, TLS: &TLS{CAFile: notPEM}}, "no PEM certificate"},
		{"CertWithoutKey", Server{Addrs: addrs, TLS: &TLS{CertFile: notPEM}}, "give both or neither"},
		{"KeyWithoutCert", Server{Addrs: addrs, TLS: &TLS{KeyFile: notPEM}}, "give both or neither"},
		{"BadKeyPair", Server{Addrs: addrs, TLS: &TLS{CertFile: notPEM, KeyFile: notPEM}}, "TLS CertFile and KeyFile"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _, err := GoRedis(tt.s)
			if err == nil {
				_ = c.Close()
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("GoRedis = %v; want an error with %q", err, tt.want)
			}
			r, _, err := Rueidis(tt.s)
			if err == nil {
				r.Close()
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Rueidis = %v; want an error with %q", err, tt.want)
			}
		})
	}
}

// TestTLSConfig: no TLS is a nil tls.Config; a TLS setup without files
// keeps its name and verification, at TLS 1.2 or later.
func TestTLSConfig(t *testing.T) {
	if c, err := (*TLS)(nil).config(); c != nil || err != nil {
		t.Errorf("nil TLS: config = %v, %v; want nil, nil", c, err)
	}
	c, err := (&TLS{ServerName: "redis.example", InsecureSkipVerify: true}).config()
	if err != nil {
		t.Fatal(err)
	}
	if c.ServerName != "redis.example" || !c.InsecureSkipVerify || c.MinVersion != tls.VersionTLS12 || c.RootCAs != nil || c.Certificates != nil {
		t.Errorf("config = %+v; want ServerName redis.example, InsecureSkipVerify, MinVersion TLS 1.2, the system's CAs, no certificate", c)
	}
}

// TestSettings: the settings in words are the ones the client was built
// with, go-redis's and rueidis's defaults filled in.
func TestSettings(t *testing.T) {
	addrs := []string{"127.0.0.1:1"}
	tests := []struct {
		name    string
		rueidis bool
		s       Server
		want    string
	}{
		{"Advised", false, Server{Addrs: addrs}, "go-redis client: MaxRetries 0, ContextTimeoutEnabled true"},
		{"Defaults", false, Server{Addrs: addrs, Retries: 3, NoContextTimeout: true}, "go-redis client: MaxRetries 3, ContextTimeoutEnabled false"},
		{"LowLatencyCluster", false, Server{Addrs: addrs, Cluster: true, LowLatency: true}, "MaxRedirects 0"},
		{"Failover", false, Server{Addrs: addrs, Sentinel: "m"}, "go-redis failover client: MaxRetries 0, ContextTimeoutEnabled true"},
		{"Sentinel", true, Server{Addrs: addrs, Sentinel: "m"}, "rueidis Sentinel client: DisableRetry true, ConnWriteTimeout 10s, Dialer.Timeout 5s"},
		{"RueidisRetries", true, Server{Addrs: addrs, Retries: 1}, "rueidis client: DisableRetry false"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var settings []string
			if tt.rueidis {
				// rueidis dials in NewClient, and nothing listens on port 1.
				_, settings = rueidisOption(tt.s, nil)
			} else {
				c, s, err := GoRedis(tt.s)
				if err != nil {
					t.Fatal(err)
				}
				settings = s
				_ = c.Close()
			}
			if got := strings.Join(settings, "; "); !strings.Contains(got, tt.want) {
				t.Errorf("settings %q; want %q", got, tt.want)
			}
		})
	}
}

// TestNewRueidisRetriesRefusedDials: a dial refused on the network (a
// server still starting) is tried again, and the first other error is
// returned at once, without another dial.
func TestNewRueidisRetriesRefusedDials(t *testing.T) {
	stop := errors.New("not a network error")
	calls, stopped := 0, 0
	opt := rueidis.ClientOption{
		InitAddress:  []string{"127.0.0.1:1"},
		DisableCache: true,
		DialCtxFn: func(context.Context, string, *net.Dialer, *tls.Config) (net.Conn, error) {
			calls++
			if calls <= 3 {
				return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
			}
			stopped++
			return nil, stop
		},
	}
	c, err := newRueidis(opt)
	if err == nil {
		c.Close()
	}
	if !errors.Is(err, stop) || calls < 4 || stopped != 1 {
		t.Fatalf("newRueidis: %v after %d dials, %d of them after the first other error; want %q after 3 refused dials and one more", err, calls, stopped-1, stop)
	}
}
