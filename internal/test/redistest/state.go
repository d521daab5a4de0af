package redistest

import (
	"encoding/binary"

	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/ratelimit"
)

// StoredBand is one bandwidth of a value in prelude.lua's layout: its two
// (unsigned, signed) pairs and its ID, for tests that read or write a
// bucket's stored value by hand.
type StoredBand struct {
	U1, S1, U2, S2 int64
	ID             string
	// W1 and W2 are the widths in bytes (1 to 7) of the first and second
	// pair as [EncodeState] writes them; 0 is 7.
	W1, W2 int
}

// The first bytes of prelude.lua's layout: each algorithm's 16 formats
// begin at [FormatOf]; the token bucket's earlier layout, which its script
// still reads, at LegacyFormat; VersionedFormat is added for a state
// built for a versioned config.
const (
	TokenBucketFormat = 112
	LegacyFormat      = 16
	VersionedFormat   = 128
)

// FormatOf is the first of alg's 16 format bytes in prelude.lua's layout.
func FormatOf(alg ratelimit.Algorithm) int {
	if alg == ratelimit.TokenBucket {
		return TokenBucketFormat
	}
	return 16 * (int(alg) + 1)
}

// EncodeState lays out a value in prelude.lua's layout, with the first
// byte format + len(bands) - 1, each pair in its band's widths; version
// above 0 adds VersionedFormat to the first byte, and the version and
// packed (a config's bandwidths as [PackedBands] gives them) after the
// bandwidths.
func EncodeState(format int, fp uint64, expiry int64, bands []StoredBand, version uint64, packed []byte) []byte {
	head := format + len(bands) - 1
	if version > 0 {
		head += VersionedFormat
	}
	v := binary.LittleEndian.AppendUint64([]byte{byte(head)}, fp)
	v = AppendN(v, uint64(expiry), 7)
	for _, b := range bands {
		v = append(v, byte(width(b.W1)<<4|width(b.W2)))
	}
	for _, b := range bands {
		w1, w2 := width(b.W1), width(b.W2)
		v = AppendN(v, uint64(b.U1), w1)
		v = AppendN(v, uint64(b.S1), w1)
		v = AppendN(v, uint64(b.U2), w2)
		v = AppendN(v, uint64(b.S2), w2)
		v = append(append(v, byte(len(b.ID))), b.ID...)
	}
	if version > 0 {
		v = AppendN(v, version, 7)
		v = AppendN(v, uint64(len(packed)), 2)
		v = append(v, packed...)
	}
	return v
}

// width is a StoredBand's width w in bytes: 0 is 7.
func width(w int) int {
	if w == 0 {
		return 7
	}
	return w
}

// AppendN appends x's low n bytes, little-endian, as the layout holds its
// integers.
func AppendN(v []byte, x uint64, n int) []byte {
	for range n {
		v = append(v, byte(x))
		x >>= 8
	}
	return v
}

// PackedBands is cfg's bandwidths as a request packs them, which is how a
// state (and a sliding log's fingerprint member) records a versioned
// config.
func PackedBands(cfg ratelimit.Config) []byte {
	arg := redisscript.NewCall("", "k", cfg, ratelimit.Request{}, 0).Arg
	return []byte(arg[36 : len(arg)-8])
}
