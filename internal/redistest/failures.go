package redistest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/ratelimit"
)

// testFailures: a closed client, a hung server, a dead one, and keys that
// hold what sluice did not write all give errors wrapping the right
// sentinel, never a panic; bad input is refused before any I/O.
func testFailures(t *testing.T, a Adapter) {
	ctx := context.Background()
	cfg := ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerHour(10)}}
	take := ratelimit.Request{Tokens: 1}

	t.Run("ClosedClient", func(t *testing.T) {
		t.Parallel()
		addr, _ := testkit.StandaloneAddr(t)
		b, closeClient := a.Connect(t, []string{addr}, false, Options{})
		closeClient()
		_, err := b.Do(ctx, uniqueKey(t, "k"), cfg, take)
		if !errors.Is(err, ratelimit.ErrBackendUnavailable) {
			t.Fatalf("Do on a closed client: %v; want ErrBackendUnavailable", err)
		}
		if _, err := b.Do(ctx, "", cfg, take); !errors.Is(err, ratelimit.ErrInvalidKey) {
			t.Fatalf("Do with an empty key on a closed client: %v; want ErrInvalidKey, found before any I/O", err)
		}
		if _, err := b.Do(ctx, "k", ratelimit.Config{}, take); !errors.Is(err, ratelimit.ErrInvalidConfig) {
			t.Fatalf("Do with no bandwidths: %v; want ErrInvalidConfig", err)
		}
	})

	t.Run("PausedServer", func(t *testing.T) {
		t.Parallel()
		r := testkit.StartRedis(t)
		b, _ := a.Connect(t, []string{r.Addr()}, false, Options{})
		key := uniqueKey(t, "k")
		if _, err := b.Do(ctx, key, cfg, take); err != nil {
			t.Fatal(err)
		}
		r.Pause(t)
		tctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		start := time.Now()
		_, err := b.Do(tctx, key, cfg, take)
		cancel()
		elapsed := time.Since(start)
		r.Resume(t)
		if !errors.Is(err, ratelimit.ErrTimeout) {
			t.Fatalf("Do on a paused server: %v; want ErrTimeout", err)
		}
		if elapsed > 2*time.Second {
			t.Errorf("Do on a paused server returned after %v; want about the context's 200ms", elapsed)
		}
		if _, err := eventually(t, func() (ratelimit.Decision, error) { return b.Do(ctx, key, cfg, take) }); err != nil {
			t.Fatalf("Do after Resume: %v", err)
		}
	})

	t.Run("KilledServer", func(t *testing.T) {
		t.Parallel()
		r := testkit.StartRedis(t)
		b, _ := a.Connect(t, []string{r.Addr()}, false, Options{})
		r.Kill(t)
		_, err := b.Do(ctx, uniqueKey(t, "k"), cfg, take)
		if !errors.Is(err, ratelimit.ErrBackendUnavailable) {
			t.Fatalf("Do on a dead server: %v; want ErrBackendUnavailable", err)
		}
	})

	t.Run("ForeignValues", func(t *testing.T) {
		t.Parallel()
		addr, _ := testkit.StandaloneAddr(t)
		top := topology{addrs: []string{addr}}
		b, _ := a.Connect(t, top.addrs, false, Options{})
		c := raw(t, top)
		for _, tc := range []struct {
			name, value, want string
		}{
			{"string", "hello", "did not write"},
			{"truncated", "\x10\x00\x00\x00\x00\x00\x00\x00\x00\xff", "corrupt state"},
			{"trailing", "\x10\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x11\x01\x01\x01\x01\x00ab", "corrupt state"},
			{"hash", "", "WRONGTYPE"},
		} {
			key := uniqueKey(t, tc.name)
			rkey := "{" + key + "}"
			if tc.name == "hash" {
				c.HSet(ctx, rkey, "f", "v")
			} else {
				c.Set(ctx, rkey, tc.value, 0)
			}
			_, err := b.Do(ctx, key, cfg, take)
			if !errors.Is(err, ratelimit.ErrBackendUnavailable) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Do on a key holding a %s: %v; want ErrBackendUnavailable saying %q", tc.name, err, tc.want)
			}
			if tc.name != "hash" {
				if got := c.Get(ctx, rkey).Val(); got != tc.value {
					t.Errorf("the %s value became %q; want it left alone", tc.name, got)
				}
			}
		}
	})
}
