package redisscript

import "reflect"

// NilClient reports whether client, a backend's client as New received
// it, is nil: nil itself, or an interface holding a nil pointer (or map,
// slice, func or channel), such as (*redis.Client)(nil). The second does
// not compare equal to nil, and would panic at the first call.
func NilClient(client any) bool {
	if client == nil {
		return true
	}
	switch v := reflect.ValueOf(client); v.Kind() {
	case reflect.Pointer, reflect.UnsafePointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return v.IsNil()
	}
	return false
}
