package redisscript_test

import (
	"encoding/binary"
	"fmt"

	"github.com/sluicehq/sluice/ratelimit"
)

// decodeState parses a stored value (the layout is in tokenbucket.lua) into
// the ratelimit.State it stands for. Rate is not stored: the script takes it
// from the config, so the caller fills it in.
func decodeState(v []byte) (ratelimit.State, error) {
	var s ratelimit.State
	if len(v) < 17 || v[0] < 16 || v[0] >= 32 {
		return s, fmt.Errorf("value %x: no header", v)
	}
	n := int(v[0]) - 15
	s.Fingerprint = binary.LittleEndian.Uint64(v[1:9])
	s.ExpiresAt = int64(uint(v[9]) | uint(v[10])<<8 | uint(v[11])<<16 | uint(v[12])<<24 | uint(v[13])<<32 | uint(v[14])<<40 | uint(v[15])<<48)
	if len(v) < 16+n {
		return s, fmt.Errorf("value %x: no widths", v)
	}
	widths, r := v[16:16+n], v[16+n:]
	for _, w := range widths {
		wu, ws := int(w>>4), int(w&15)
		if wu < 1 || wu > 7 || ws < 1 || ws > 7 || len(r) < 2*wu+2*ws+1 {
			return s, fmt.Errorf("value %x: bad widths or truncated", v)
		}
		var b ratelimit.BandState
		b.Capacity, r = int64(uintN(r, wu)), r[wu:]
		b.Scale, r = int64(uintN(r, wu)), r[wu:]
		b.Level, r = intN(r, ws), r[ws:]
		b.Stamp, r = s.ExpiresAt-intN(r, ws), r[ws:]
		idlen := int(r[0])
		if len(r) < 1+idlen {
			return s, fmt.Errorf("value %x: ID runs past the end", v)
		}
		b.ID, r = string(r[1:1+idlen]), r[1+idlen:]
		s.Bands = append(s.Bands, b)
	}
	if len(r) != 0 {
		return s, fmt.Errorf("value %x: %d bytes left over", v, len(r))
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
