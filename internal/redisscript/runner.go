package redisscript

import (
	"context"
	"strings"
	"sync/atomic"
)

// A Client is what [Runner] needs of a backend's Redis client. Each
// method returns the client's error as it is; Runner reads Redis's replies
// from it, and the backend maps what Runner returns with [Error].
type Client interface {
	// FCall calls the function fn of [Functions] with KEYS[1] key and
	// ARGV[1] arg, on the master that serves key, and returns its reply.
	FCall(ctx context.Context, fn, key, arg string) (string, error)
	// LoadFunctions loads [Functions] with FUNCTION LOAD (no REPLACE) on
	// the master that serves key.
	LoadFunctions(ctx context.Context, key string) error
	// Eval runs Scripts[script] with KEYS[1] key and ARGV[1] arg by
	// EVALSHA, sending it with EVAL when the server answers NOSCRIPT, and
	// returns its reply.
	Eval(ctx context.Context, script int, key, arg string) (string, error)
}

// Runner runs a [Call] on a backend's client: as a function of
// [Functions], which it loads on a server that lacks it, or, once a server
// has refused Redis Functions, as a script. It is safe for concurrent use.
//
// A call goes out as FCALL. A server that lacks the library (a new one,
// one restarted without persistence, one that lost it to FUNCTION FLUSH)
// answers that the function is not found; Runner then loads the library
// there and sends the FCALL once more. Another process may load the same
// library at the same moment: its name is taken, which is as good as
// loaded. Runner never replaces, flushes or deletes a library: its name
// carries the hash of its source, so another version of sluice on the same
// server has its own.
//
// A server that refuses FCALL or FUNCTION LOAD (Redis before 7.0, a
// FUNCTION renamed away, an ACL or a proxy that refuses it) makes the
// Runner send every later call, this one first, by EVALSHA instead: the
// same decision, for the price of defining the script's helpers on every
// call. The first such refusal decides; Runner does not ask again.
type Runner struct {
	client   Client
	evalOnly atomic.Bool
}

// NewRunner returns a Runner over c that tries Functions first.
func NewRunner(c Client) *Runner {
	return &Runner{client: c}
}

// Run runs c and returns its reply for [Call.Decision], or the client's
// error.
func (r *Runner) Run(ctx context.Context, c Call) (string, error) {
	if !r.evalOnly.Load() {
		reply, err := r.fcall(ctx, c)
		if !r.refused(err) {
			return reply, err
		}
	}
	return r.client.Eval(ctx, c.Script, c.Key, c.Arg)
}

// fcall sends c by FCALL, loading the library and sending it again if
// the server lacks it.
func (r *Runner) fcall(ctx context.Context, c Call) (string, error) {
	fn := Functions.Functions[c.Script]
	reply, err := r.client.FCall(ctx, fn, c.Key, c.Arg)
	if err == nil || !functionMissing(err) {
		return reply, err
	}
	if err := r.client.LoadFunctions(ctx, c.Key); err != nil && !libraryExists(err) {
		return "", err
	}
	return r.client.FCall(ctx, fn, c.Key, c.Arg)
}

// Loaded reads err, the outcome of a FUNCTION LOAD of [Functions] that a
// backend's Check sent to a server: nil if the server now has the library
// (loaded now, or before under the same name), is a replica (READONLY: it
// gets the library from its master), or refused Functions, which makes r
// run scripts from then on (see [Runner.EvalOnly]); err otherwise.
func (r *Runner) Loaded(err error) error {
	if err == nil || libraryExists(err) || strings.HasPrefix(err.Error(), "READONLY") || r.refused(err) {
		return nil
	}
	return err
}

// EvalOnly reports whether a server has refused Redis Functions, so that r
// runs every call as a script.
func (r *Runner) EvalOnly() bool { return r.evalOnly.Load() }

// refused reports whether err is a server's refusal of Redis Functions,
// and if so makes r run scripts from then on.
func (r *Runner) refused(err error) bool {
	if err == nil || !functionsRefused(err) {
		return false
	}
	r.evalOnly.Store(true)
	return true
}

// Redis's replies that Runner acts on, as Redis 7.0 words them after its
// error code ERR, which go-redis keeps and rueidis drops (see reply). They
// are matched from the start of the message only: the scripts' own errors
// name the user's key, which may hold any words, but start with "sluice:".
const missingReply = "Function not found"

// reply is err's message without the error code ERR.
func reply(err error) string { return strings.TrimPrefix(err.Error(), "ERR ") }

func functionMissing(err error) bool { return reply(err) == missingReply }

// libraryExists reports whether err is FUNCTION LOAD's refusal of a
// library named as [Functions] is: the same source, loaded meanwhile.
func libraryExists(err error) bool {
	return reply(err) == "Library '"+Functions.Name+"' already exists"
}

// refusals start the errors of a server that refuses FCALL or FUNCTION
// itself: an unknown command (Redis 6, a renamed FUNCTION), one that a
// proxy does not pass on, or one that the user's ACL denies.
var refusals = []string{"unknown command", "unknown subcommand", "unsupported command", "NOPERM"}

func functionsRefused(err error) bool {
	msg := reply(err)
	for _, r := range refusals {
		if strings.HasPrefix(msg, r) {
			return true
		}
	}
	return false
}
