package sharding

import (
	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/ratelimit"
)

// A tag ends a sub-key on a backend with slots and picks its slot: tagLen
// octal digits. Redis Cluster puts a key on the low 14 bits of its CRC16,
// and CRC16 is linear (see [redisscript.CRC16]), so those bits are linear
// functions of the bits of the digits: 18 bits onto 14 that reach every
// slot (five digits' 15 bits reach only 2^13 slots; TestTagForEverySlot
// checks every one). A tag for a slot is then found by solving, not by
// trying tags in turn: [appendTag].
const tagLen = 6

// zeroTag is the tag whose digits are all 0.
const zeroTag = "000000"

// crcSlot is the slot Redis Cluster would give s hashed whole: the low 14
// bits of its CRC16.
func crcSlot(s string) int {
	return int(redisscript.CRC16(s)) % ratelimit.NumSlots
}

// zeroTagSlot is crcSlot(zeroTag).
var zeroTagSlot = crcSlot(zeroTag)

// tagBits[b] is the digit bits (bit 3j+k for bit k of digit j) whose XOR
// into zeroTag flips bit b of its crcSlot and no other.
var tagBits = solveTagBits()

// solveTagBits finds tagBits by Gaussian elimination over GF(2): each
// digit bit flips crcSlot by the crcSlot of the bytes that are 0 but for
// that bit (CRC16 of a XOR is the XOR of CRC16s), and 14 of the 18 such
// vectors are a basis of the slots' bits.
func solveTagBits() [14]uint32 {
	var vec [14]int     // vec[p]: a vector whose highest bit is p, once found
	var bits [14]uint32 // and the digit bits whose flips sum to it
	for k := range 3 * tagLen {
		var flip [tagLen]byte
		flip[k/3] = 1 << (k % 3)
		v, m := crcSlot(string(flip[:])), uint32(1)<<k
		for p := 13; p >= 0 && v != 0; p-- {
			switch {
			case v>>p&1 == 0:
			case vec[p] == 0:
				vec[p], bits[p] = v, m
				v = 0
			default:
				v ^= vec[p]
				m ^= bits[p]
			}
		}
	}
	// Clear the lower bits of each vector with the ones below it, already
	// cleared, so that vec[p] is bit p alone.
	for p := range vec {
		for q := range p {
			if vec[p]>>q&1 != 0 {
				vec[p] ^= vec[q]
				bits[p] ^= bits[q]
			}
		}
	}
	return bits
}

// appendTag appends to dst the tag whose crcSlot is x, for 0 ≤ x <
// NumSlots: zeroTag with the digit bits flipped that flip
// crcSlot(zeroTag) to x.
func appendTag(dst []byte, x int) []byte {
	var flips uint32
	for b, d := 0, x^zeroTagSlot; d != 0; b, d = b+1, d>>1 {
		if d&1 != 0 {
			flips ^= tagBits[b]
		}
	}
	for j := range tagLen {
		dst = append(dst, '0'+byte(flips>>(3*j)&7))
	}
	return dst
}
