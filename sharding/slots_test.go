package sharding

import (
	"context"
	"errors"
	"testing"

	"github.com/sluicehq/sluice/ratelimit"
)

// TestSlotsMemory: on the memory backend, which has no slots, a hot key's
// sub-buckets are listed with Slot -1 and no Master; a key no rule
// matches is an ErrInvalidKey; and the capabilities say they cannot tell.
func TestSlotsMemory(t *testing.T) {
	mem := newMemory(t, newClock())
	b := mustNew(t, mem, Keys(4, "hot"), Prefix(3, "p:"))
	for key, n := range map[string]int{"hot": 4, "p:1": 3} {
		subs, err := b.Slots(context.Background(), key)
		if err != nil || len(subs) != n {
			t.Fatalf("Slots(%q): %v, %v; want %d", key, subs, err, n)
		}
		for i, s := range subs {
			if want := (SubBucket{Key: subKeys(t, b, key)[i], Slot: -1}); s != want {
				t.Errorf("Slots(%q)[%d] = %+v; want %+v", key, i, s, want)
			}
		}
	}
	for _, key := range []string{"cold", "hot\x000.4", ""} {
		if subs, err := b.Slots(context.Background(), key); !isInvalidKey(err) || subs != nil {
			t.Errorf("Slots(%q): %v, %v; want ErrInvalidKey", key, subs, err)
		}
	}
	if s, ok := b.Slot("cold"); s != 0 || ok {
		t.Errorf("Slot: %d, %v; want 0, false", s, ok)
	}
	if node := b.Node("cold"); node != "" {
		t.Errorf("Node: %q; want none", node)
	}
	if _, err := b.Masters(context.Background()); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Masters: %v; want ErrUnsupported", err)
	}
}

// TestSlotsCluster: over a backend with slots and masters, Slots gives each
// sub-bucket's slot and the master serving it, every master serving one
// with n = 3 on three; Slot, Node and Masters of a key no rule matches are
// the wrapped backend's, and a hot key has no one slot or node.
func TestSlotsCluster(t *testing.T) {
	next := &cluster{slotted: slotted{newMemory(t, newClock())}, masters: threeMasters}
	b := mustNew(t, next, Keys(3, "hot"), Prefix(6, "p:"))
	for key, n := range map[string]int{"hot": 3, "p:1": 6} {
		subs, err := b.Slots(context.Background(), key)
		if err != nil || len(subs) != n {
			t.Fatalf("Slots(%q): %v, %v; want %d", key, subs, err, n)
		}
		served := map[string]int{}
		for i, s := range subs {
			slot, _ := next.Slot(s.Key)
			if s.Slot != slot || s.Master != next.Node(s.Key) || s.Master == "" {
				t.Errorf("Slots(%q)[%d] = %+v; the key is on slot %d of %q", key, i, s, slot, next.Node(s.Key))
			}
			served[s.Master]++
		}
		for _, m := range threeMasters {
			if served[m.Addr] != n/3 {
				t.Errorf("Slots(%q): %s serves %d sub-buckets; want %d", key, m.Addr, served[m.Addr], n/3)
			}
		}
	}
	for _, key := range []string{"cold", "p", "hot\x000.3"} {
		want, _ := next.Slot(key)
		if s, ok := b.Slot(key); s != want || !ok {
			t.Errorf("Slot(%q): %d, %v; want the wrapped backend's %d", key, s, ok, want)
		}
		if node := b.Node(key); node != next.Node(key) || node == "" {
			t.Errorf("Node(%q): %q; want the wrapped backend's %q", key, node, next.Node(key))
		}
	}
	for _, key := range []string{"hot", "p:1"} {
		if s, ok := b.Slot(key); s != 0 || ok {
			t.Errorf("Slot(%q) of a hot key: %d, %v; want 0, false", key, s, ok)
		}
		if node := b.Node(key); node != "" {
			t.Errorf("Node(%q) of a hot key: %q; want none", key, node)
		}
	}
	if masters, err := b.Masters(context.Background()); err != nil || len(masters) != 3 || masters[0].Addr != threeMasters[0].Addr {
		t.Errorf("Masters: %v, %v; want the wrapped backend's", masters, err)
	}
}

// TestSlotsNoTopology: with slots but no masters, Slots gives the slots
// and no Master.
func TestSlotsNoTopology(t *testing.T) {
	b := mustNew(t, slotted{newMemory(t, newClock())}, Keys(2, "hot"))
	subs, err := b.Slots(context.Background(), "hot")
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range subs {
		if lo, hi := target(2, i); s.Slot < lo || s.Slot >= hi || s.Master != "" {
			t.Errorf("Slots[%d] = %+v; want a slot in [%d, %d) and no master", i, s, lo, hi)
		}
	}
	if _, err := b.Masters(context.Background()); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Masters: %v; want ErrUnsupported", err)
	}
}

// TestSlotsMastersError: an error from the masters other than
// ErrUnsupported is Slots' error.
func TestSlotsMastersError(t *testing.T) {
	b := mustNew(t, failingMasters{slotted{newMemory(t, newClock())}}, Keys(2, "hot"))
	if _, err := b.Slots(context.Background(), "hot"); !errors.Is(err, ratelimit.ErrTimeout) {
		t.Errorf("Slots: %v; want the masters' ErrTimeout", err)
	}
}

type failingMasters struct{ slotted }

func (failingMasters) Masters(context.Context) ([]ratelimit.Master, error) { return nil, errTimeout }
