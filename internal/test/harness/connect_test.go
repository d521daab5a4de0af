package harness

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"syscall"
	"testing"

	"github.com/redis/rueidis"
)

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
