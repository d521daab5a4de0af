package redisscript

import (
	"strings"

	"github.com/sluicehq/sluice/ratelimit"
)

// Slot returns the Redis Cluster hash slot of the bucket at the user's key
// under prefix, and of its permits ([PermitKey]): what [KeySlot] says of
// the Redis key [Key] makes, without making it. For a key that is not empty, under a prefix without braces
// (as [Settings.Check] requires), that is CRC16 of the hash tag, the key
// itself once escaped, so the prefix plays no part and Slot allocates only
// for a key holding a character the tag escapes. The empty key, which no
// bucket has ([ratelimit.ErrInvalidKey]), makes an empty tag, which Redis
// ignores: it hashes the whole Redis key, prefix included.
func Slot(prefix, key string) int {
	switch {
	case key == "" || strings.ContainsAny(prefix, "{}"):
		return KeySlot(Key(prefix, key))
	case strings.ContainsAny(key, "{}%"):
		key = tagEscaper.Replace(key)
	}
	return int(CRC16(key)) % ratelimit.NumSlots
}

// KeySlot returns the hash slot of any Redis key, by Redis's rule: if the
// key holds a '{' followed later by a '}' with at least one byte between
// them, only the bytes between the first '{' and the first '}' after it
// are hashed; otherwise the whole key is. It is what CLUSTER KEYSLOT
// answers.
func KeySlot(rkey string) int {
	if open := strings.IndexByte(rkey, '{'); open >= 0 {
		if n := strings.IndexByte(rkey[open+1:], '}'); n > 0 {
			rkey = rkey[open+1 : open+1+n]
		}
	}
	return int(CRC16(rkey)) % ratelimit.NumSlots
}

// CRC16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0, no
// reflection, no final XOR), the checksum Redis Cluster hashes keys with:
// a key's slot is its low 14 bits. It is linear: for strings u and v of
// one length, CRC16 of their bytewise XOR is CRC16(u) ^ CRC16(v), which
// is what lets the sharding package aim a sub-bucket's key at a slot.
func CRC16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^s[i]]
	}
	return crc
}

// crc16Table holds CRC16's remainder of each byte value.
var crc16Table = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()
