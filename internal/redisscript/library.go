package redisscript

import (
	"crypto/sha1"
	"encoding/hex"
	"strings"
)

// A Library is the Redis Functions library of every algorithm and of the
// permits: loaded once per server with FUNCTION LOAD, then called with
// FCALL. Loading runs prelude.lua and the algorithms' files (and
// permits.lua) once, so a call runs only the decision, not the definitions
// of every helper as a script does.
type Library struct {
	// Name is the library's name: "sluice_" and a hash of the Lua source.
	// Two versions of sluice with different scripts so have libraries of
	// different names, and one server can hold both.
	Name string
	// Source is FUNCTION LOAD's argument.
	Source string
	// Functions are the functions' names, Name, "_" and the file's name
	// without .lua, by the index of [Scripts] (see [Call.Script]). FCALL's
	// KEYS[1] and ARGV[1] are as a script's.
	Functions []string
}

// Functions is the library of the scripts in [Scripts].
var Functions = newLibrary()

// hashLen is the hex digits of the source's SHA-1 in a library's name.
const hashLen = 16

func newLibrary() Library {
	code := prelude
	for _, a := range algorithms {
		code += a.Source
	}
	code += permits
	sum := sha1.Sum([]byte(code))
	lib := Library{Name: "sluice_" + hex.EncodeToString(sum[:])[:hashLen]}
	var b strings.Builder
	b.WriteString("#!lua name=" + lib.Name + "\n")
	b.WriteString(prelude)
	// Each file in a block of its own: their locals, run among them, do
	// not meet.
	for _, a := range algorithms {
		fn := lib.Name + "_" + a.Name
		lib.Functions = append(lib.Functions, fn)
		b.WriteString("do\n" + a.Source)
		b.WriteString("redis.register_function('" + fn + "', function(keys, args)\n" + entry("keys", "args") + "end)\nend\n")
	}
	fn := lib.Name + "_" + permitsName
	lib.Functions = append(lib.Functions, fn)
	b.WriteString("do\n" + permits + "redis.register_function('" + fn + "', permits)\nend\n")
	lib.Source = b.String()
	return lib
}
