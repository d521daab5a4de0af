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

var tagEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")
