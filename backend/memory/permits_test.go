package memory_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend/memory"
	"github.com/sluicehq/sluice/ratelimit"
)

func acquire(t *testing.T, b *memory.Backend, key, holder string, lim ratelimit.Concurrency) ratelimit.PermitDecision {
	t.Helper()
	d, err := b.DoPermit(context.Background(), key, lim, ratelimit.PermitRequest{Holder: holder, Weight: 1})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// A key whose permits are all released keeps its state until a new key
// at the cap needs the room (or the sweep runs): an acquire after it
// finds the state there. Calls on an absent key store nothing.
func TestPermitKeysAreKeptUntilSwept(t *testing.T) {
	b := memory.New(memory.WithSweepInterval(0), memory.WithMaxKeys(2))
	defer b.Close()
	lim := ratelimit.InFlight(2, time.Hour)
	acquire(t, b, "k", "a", lim)
	if n := b.PermitKeys(); n != 1 {
		t.Fatalf("%d permit keys after an acquire; want 1", n)
	}
	if _, err := b.DoPermit(context.Background(), "k", lim, ratelimit.PermitRequest{Op: ratelimit.PermitRelease, Holder: "a"}); err != nil {
		t.Fatal(err)
	}
	if n := b.PermitKeys(); n != 1 {
		t.Fatalf("%d permit keys after the last release; want 1, kept until swept", n)
	}
	if d := acquire(t, b, "k", "b", lim); !d.Granted || d.InFlight != 1 {
		t.Fatalf("an acquire on the emptied key: %+v; want granted, 1 in flight", d)
	}
	if _, err := b.DoPermit(context.Background(), "k", lim, ratelimit.PermitRequest{Op: ratelimit.PermitRelease, Holder: "b"}); err != nil {
		t.Fatal(err)
	}
	// A release, renew or inspect of an absent key stores nothing.
	for _, op := range []ratelimit.PermitOp{ratelimit.PermitRelease, ratelimit.PermitRenew, ratelimit.PermitInspect} {
		if _, err := b.DoPermit(context.Background(), "absent", lim, ratelimit.PermitRequest{Op: op, Holder: "a"}); err != nil {
			t.Fatal(err)
		}
	}
	if n := b.PermitKeys(); n != 1 {
		t.Fatalf("%d permit keys after calls on an absent key; want 1", n)
	}
	// Two new keys at a cap of 2: the first fits, the second finds the
	// room of the emptied key.
	acquire(t, b, "l", "a", lim)
	if d := acquire(t, b, "m", "a", lim); !d.Granted {
		t.Fatalf("a new key at the cap, beside an emptied one: %+v; want granted", d)
	}
	if n := b.PermitKeys(); n != 2 {
		t.Fatalf("%d permit keys; want 2: the emptied key dropped", n)
	}
}

func TestPermitMaxKeysSweepsEndedLeases(t *testing.T) {
	clock := newClock()
	b := memory.New(memory.WithClock(clock), memory.WithMaxKeys(3), memory.WithSweepInterval(0))
	defer b.Close()
	short, long := ratelimit.InFlight(1, time.Second), ratelimit.InFlight(1, time.Hour)
	acquire(t, b, "a", "h", short)
	acquire(t, b, "b", "h", long)
	acquire(t, b, "c", "h", long)
	_, err := b.DoPermit(context.Background(), "d", long, ratelimit.PermitRequest{Holder: "h", Weight: 1})
	if !errors.Is(err, memory.ErrTooManyKeys) || !errors.Is(err, ratelimit.ErrKeyRejected) {
		t.Fatalf("a fourth key at a cap of 3: %v; want ErrTooManyKeys", err)
	}
	// The keys held keep their permits.
	if d := acquire(t, b, "b", "i", long); d.Granted || d.InFlight != 1 {
		t.Fatalf("a full key after the refusal: %+v", d)
	}
	clock.Advance(time.Second)
	if d := acquire(t, b, "d", "h", long); !d.Granted {
		t.Fatalf("a new key once a's lease has ended: %+v; want it granted", d)
	}
	if n := b.PermitKeys(); n != 3 {
		t.Fatalf("%d permit keys; want 3", n)
	}
}

func TestPermitSweepDropsEndedLeases(t *testing.T) {
	clock := newClock()
	b := memory.New(memory.WithClock(clock), memory.WithSweepInterval(time.Millisecond))
	defer b.Close()
	for i := range 10 {
		acquire(t, b, fmt.Sprint(i), "h", ratelimit.InFlight(1, time.Second))
	}
	clock.Advance(time.Second)
	deadline := time.Now().Add(time.Minute)
	for b.PermitKeys() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d permit keys a minute after every lease ended; want the sweep to drop them", b.PermitKeys())
		}
		time.Sleep(time.Millisecond)
	}
}

func TestPermitCloseDropsAndRefuses(t *testing.T) {
	b := memory.New()
	acquire(t, b, "k", "h", ratelimit.InFlight(1, time.Hour))
	b.Close()
	if n := b.PermitKeys(); n != 0 {
		t.Fatalf("%d permit keys after Close; want 0", n)
	}
	if _, err := b.DoPermit(context.Background(), "k", ratelimit.InFlight(1, time.Hour), ratelimit.PermitRequest{Holder: "h", Weight: 1}); !errors.Is(err, memory.ErrClosed) {
		t.Fatalf("DoPermit after Close: %v; want ErrClosed", err)
	}
}

func TestPermitsAgreeWithApplyPermit(t *testing.T) {
	clock := newClock()
	b := memory.New(memory.WithClock(clock), memory.WithSweepInterval(0))
	defer b.Close()
	var st ratelimit.PermitState
	seed := uint64(7)
	next := func(n uint64) uint64 {
		seed = seed*6364136223846793005 + 1442695040888963407
		return (seed >> 33) % n
	}
	for i := range 5000 {
		lim := ratelimit.InFlight(int64(next(6))+1, time.Duration(next(20)+1)*time.Millisecond)
		req := ratelimit.PermitRequest{Op: ratelimit.PermitOp(next(4)), Holder: fmt.Sprint(next(8)), Weight: int64(next(uint64(lim.Limit))) + 1}
		clock.Advance(time.Duration(next(3000)) * time.Microsecond)
		got, err := b.DoPermit(context.Background(), "k", lim, req)
		if err != nil {
			t.Fatal(err)
		}
		if want := ratelimit.ApplyPermit(&st, lim, req, clock.Now().UnixMicro()); got != want {
			t.Fatalf("call %d: %+v on %+v = %+v; ApplyPermit says %+v", i, req, lim, got, want)
		}
	}
}

// A key's permits are decided in the order of their calls' times: a call
// whose clock reads earlier than the last decided (a clock stepped back,
// or a call that read it just before another decided) decides as of that
// last time, so no lease that has ended comes back and a wait is never
// longer than from then.
func TestPermitTimeNeverGoesBack(t *testing.T) {
	clock := newClock()
	b := memory.New(memory.WithClock(clock), memory.WithSweepInterval(0))
	defer b.Close()
	lim := ratelimit.InFlight(1, 10*time.Second)
	acquire(t, b, "k", "a", lim)
	clock.Advance(-5 * time.Second)
	if d := acquire(t, b, "k", "b", lim); d.Granted || d.RetryAfter != 10*time.Second {
		t.Fatalf("an acquire at a clock 5s back: %+v; want denied, RetryAfter 10s from the last time decided", d)
	}
	clock.Advance(15 * time.Second) // 10s after a's acquire
	if d := acquire(t, b, "k", "b", lim); !d.Granted {
		t.Fatalf("an acquire once a's lease has ended: %+v; want granted", d)
	}
}
