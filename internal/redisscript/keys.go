package redisscript

import "strings"

// Key returns the Redis key of the bucket at the user's key: prefix, then
// the key inside a hash tag, {key}, so that Redis Cluster places the bucket
// by the whole user key. Braces in the key would end or start the tag
// early and let a caller pick the slot of its bucket, so '{', '}' and the
// escape character '%' are percent-encoded (%7B, %7D, %25); keys without
// them are used as they are. Distinct user keys give distinct Redis keys.
func Key(prefix, key string) string {
	if strings.ContainsAny(key, "{}%") {
		key = tagEscaper.Replace(key)
	}
	return prefix + "{" + key + "}"
}

// PermitKey returns the Redis key of the concurrency permits at the
// user's key: [Key]'s, then ":permits". It shares the bucket's hash tag, so
// that in a cluster a key's permits live on the slot of its bucket ([Slot]),
// and, under a prefix without braces (as [Settings.Check] requires), it
// never equals a bucket's key, which ends with the tag's '}', nor another
// user key's permits key: the tag ends at the only '}' in it.
func PermitKey(prefix, key string) string { return Key(prefix, key) + permitSuffix }

// permitSuffix follows a permits key's hash tag.
const permitSuffix = ":permits"

var tagEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")
