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
	if len(v) < 10 || v[0] != 1 {
		return s, fmt.Errorf("value %x: no format byte and fingerprint", v)
	}
	s.Fingerprint = binary.LittleEndian.Uint64(v[1:9])
	r := reader(v[9:])
	s.ExpiresAt = int64(r.uvarint())
	for len(r) > 0 {
		var b ratelimit.BandState
		b.Capacity = int64(r.uvarint())
		b.Scale = int64(r.uvarint())
		b.Level = r.varint()
		b.Stamp = s.ExpiresAt - r.varint()
		n := int(r.byte())
		if n > len(r) {
			return s, fmt.Errorf("value %x: ID runs past the end", v)
		}
		b.ID, r = string(r[:n]), r[n:]
		s.Bands = append(s.Bands, b)
	}
	if r == nil {
		return s, fmt.Errorf("value %x: truncated", v)
	}
	return s, nil
}

// reader consumes a value; it becomes nil when a read runs past the end.
type reader []byte

func (r *reader) uvarint() uint64 {
	x, n := binary.Uvarint(*r)
	if n <= 0 {
		*r = nil
		return 0
	}
	*r = (*r)[n:]
	return x
}

func (r *reader) varint() int64 {
	x, n := binary.Varint(*r)
	if n <= 0 {
		*r = nil
		return 0
	}
	*r = (*r)[n:]
	return x
}

func (r *reader) byte() byte {
	if len(*r) == 0 {
		*r = nil
		return 0
	}
	c := (*r)[0]
	*r = (*r)[1:]
	return c
}
