package redisscript

// FastOnly is the token bucket's script with its fast path alone: a call
// the fast path does not answer fails, so a test can tell that it did.
var FastOnly = prelude + tokenBucket + "\nlocal reply = fast(KEYS, ARGV)\nif reply then\n  return reply\nend\n" +
	"return redis.error_reply('the fast path did not answer')\n"
