package servers

import (
	"errors"
	"net"
	"testing"
)

// TestLaunchPortTaken checks that launch reports a taken port as
// errPortInUse, which start retries, even when the holder answers like
// redis-server.
func TestLaunchPortTaken(t *testing.T) {
	t.Parallel()
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	tests := []struct {
		name    string
		port    int
		args    []string
		wantUse bool
	}{
		{"silent listener", silent.Addr().(*net.TCPAddr).Port, nil, true},
		{"another redis-server", StartRedis(t).port, nil, true},
		{"bad config", FreePorts(t, 1)[0], []string{"--no-such-option", "x"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &Redis{bin: RequireRedisServer(t), dir: t.TempDir(), args: tt.args, port: tt.port}
			err := r.launch()
			if err == nil {
				r.kill()
				t.Fatal("launch succeeded")
			}
			if errors.Is(err, errPortInUse) != tt.wantUse {
				t.Fatalf("launch: %v; want errors.Is(err, errPortInUse) = %v", err, tt.wantUse)
			}
		})
	}
}
