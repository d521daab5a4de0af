package redisscript_test

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/sluicehq/sluice/internal/test/redistest"
	"github.com/sluicehq/sluice/ratelimit"
)

// storedBand is one bandwidth of a stored value in prelude.lua's layout.
type storedBand = redistest.StoredBand

// decodeStored parses a value in prelude.lua's layout written for alg.
func decodeStored(v []byte, alg ratelimit.Algorithm) (fp uint64, expiry int64, bands []storedBand, err error) {
	fp, expiry, bands, _, _, err = decodeVersioned(v, alg)
	return fp, expiry, bands, err
}

// decodeVersioned is decodeStored that also returns the config version the
// value records and, for a version above 0, its packed bandwidths.
func decodeVersioned(v []byte, alg ratelimit.Algorithm) (fp uint64, expiry int64, bands []storedBand, version uint64, packed []byte, err error) {
	format := redistest.FormatOf(alg)
	head := 0
	if len(v) > 0 {
		head = int(v[0]) % redistest.VersionedFormat
	}
	if len(v) < 17 || head < format || head >= format+16 {
		return 0, 0, nil, 0, nil, fmt.Errorf("value %x: no %v header", v, alg)
	}
	n := head - format + 1
	fp = binary.LittleEndian.Uint64(v[1:9])
	expiry = int64(uintN(v[9:], 7))
	if len(v) < 16+n {
		return 0, 0, nil, 0, nil, fmt.Errorf("value %x: no widths", v)
	}
	widths, r := v[16:16+n], v[16+n:]
	for _, w := range widths {
		w1, w2 := int(w>>4), int(w&15)
		if w1 < 1 || w1 > 7 || w2 < 1 || w2 > 7 || len(r) < 2*w1+2*w2+1 {
			return 0, 0, nil, 0, nil, fmt.Errorf("value %x: bad widths or truncated", v)
		}
		var b storedBand
		b.U1, r = int64(uintN(r, w1)), r[w1:]
		b.S1, r = intN(r, w1), r[w1:]
		b.U2, r = int64(uintN(r, w2)), r[w2:]
		b.S2, r = intN(r, w2), r[w2:]
		idlen := int(r[0])
		if len(r) < 1+idlen {
			return 0, 0, nil, 0, nil, fmt.Errorf("value %x: ID runs past the end", v)
		}
		b.ID, r = string(r[1:1+idlen]), r[1+idlen:]
		bands = append(bands, b)
	}
	if v[0] >= redistest.VersionedFormat {
		if len(r) < 9 || len(r) != 9+int(binary.LittleEndian.Uint16(r[7:9])) {
			return 0, 0, nil, 0, nil, fmt.Errorf("value %x: no version and config after the bandwidths", v)
		}
		version, packed, r = uintN(r, 7), r[9:], nil
	}
	if len(r) != 0 {
		return 0, 0, nil, 0, nil, fmt.Errorf("value %x: %d bytes left over", v, len(r))
	}
	return fp, expiry, bands, version, packed, nil
}

// packedBands is how a state records a versioned config, or nothing for a
// nil one.
func packedBands(cfg *ratelimit.Config) []byte {
	if cfg == nil {
		return nil
	}
	return redistest.PackedBands(*cfg)
}

// checkVersion compares the version and config a state records with
// Apply's.
func checkVersion(version uint64, packed []byte, state ratelimit.State) error {
	if version != state.Version || !bytes.Equal(packed, packedBands(state.Config)) {
		return fmt.Errorf("stored version %d, config %x\nwant version %d, config %x", version, packed, state.Version, packedBands(state.Config))
	}
	return nil
}

// decodeState parses a token bucket's stored value into the
// ratelimit.State it stands for, but for Rate, which is not stored.
func decodeState(v []byte) (s ratelimit.State, err error) {
	fp, expiry, bands, err := decodeStored(v, ratelimit.TokenBucket)
	if err != nil {
		return s, err
	}
	s.Fingerprint, s.ExpiresAt = fp, expiry
	for _, b := range bands {
		s.Bands = append(s.Bands, ratelimit.BandState{ID: b.ID, Capacity: b.U1, Level: b.S1, Scale: b.U2, Stamp: expiry - b.S2})
	}
	return s, nil
}

// uintN reads an n-byte little-endian unsigned integer.
func uintN(b []byte, n int) uint64 {
	var x uint64
	for i := n - 1; i >= 0; i-- {
		x = x<<8 | uint64(b[i])
	}
	return x
}

// intN reads an n-byte little-endian two's complement integer.
func intN(b []byte, n int) int64 {
	shift := 64 - 8*n
	return int64(uintN(b, n)<<shift) >> shift
}
