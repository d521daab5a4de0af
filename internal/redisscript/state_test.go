package redisscript_test

import (
	"encoding/binary"
	"fmt"

	"github.com/sluicehq/sluice/ratelimit"
)

// decodeState parses a stored value (the layout is in tokenbucket.lua) into
// the ratelimit.State it stands for. Rate and Scale are not stored, and
// Level is stored as whole tokens and a fraction: decodeState sets Scale to
// 1 and Level to the whole tokens, and the fraction is returned alongside.
func decodeState(v []byte) (s ratelimit.State, fractions []int64, err error) {
	if len(v) < 17 || v[0] < 16 || v[0] >= 32 {
		return s, nil, fmt.Errorf("value %x: no header", v)
	}
	n := int(v[0]) - 15
	s.Fingerprint = binary.LittleEndian.Uint64(v[1:9])
	s.ExpiresAt = int64(uint(v[9]) | uint(v[10])<<8 | uint(v[11])<<16 | uint(v[12])<<24 | uint(v[13])<<32 | uint(v[14])<<40 | uint(v[15])<<48)
	if len(v) < 16+n {
		return s, nil, fmt.Errorf("value %x: no widths", v)
	}
	widths, r := v[16:16+n], v[16+n:]
	for _, w := range widths {
		wt, wf := int(w>>4), int(w&15)
		if wt < 1 || wt > 7 || wf < 1 || wf > 7 || len(r) < 2*wt+2*wf+1 {
			return s, nil, fmt.Errorf("value %x: bad widths or truncated", v)
		}
		b := ratelimit.BandState{Scale: 1}
		b.Capacity, r = int64(uintN(r, wt)), r[wt:]
		b.Level, r = intN(r, wt), r[wt:]
		fractions, r = append(fractions, int64(uintN(r, wf))), r[wf:]
		b.Stamp, r = s.ExpiresAt-intN(r, wf), r[wf:]
		idlen := int(r[0])
		if len(r) < 1+idlen {
			return s, nil, fmt.Errorf("value %x: ID runs past the end", v)
		}
		b.ID, r = string(r[1:1+idlen]), r[1+idlen:]
		s.Bands = append(s.Bands, b)
	}
	if len(r) != 0 {
		return s, nil, fmt.Errorf("value %x: %d bytes left over", v, len(r))
	}
	return s, fractions, nil
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
