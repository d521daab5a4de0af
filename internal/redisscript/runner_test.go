package redisscript_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/redisscript"
	"github.com/sluicehq/sluice/ratelimit"
)

// fakeClient answers a Runner's commands from a script of replies: each
// method takes the next error of its list, nil once the list is spent.
type fakeClient struct {
	fcall, load, eval []error
	sent              []string // the commands, in order
}

var decision = packReply(1, 1, 10, 9, 0, 6000000, 600000, 0)

func next(errs *[]error) error {
	if len(*errs) == 0 {
		return nil
	}
	err := (*errs)[0]
	*errs = (*errs)[1:]
	return err
}

func (f *fakeClient) FCall(_ context.Context, fn, _, _ string) (string, error) {
	f.sent = append(f.sent, "FCALL "+fn)
	if err := next(&f.fcall); err != nil {
		return "", err
	}
	return decision, nil
}

func (f *fakeClient) LoadFunctions(context.Context, string) error {
	f.sent = append(f.sent, "FUNCTION LOAD")
	return next(&f.load)
}

func (f *fakeClient) Eval(_ context.Context, script int, _, _ string) (string, error) {
	f.sent = append(f.sent, "EVALSHA "+redisscript.Scripts[script].Name)
	if err := next(&f.eval); err != nil {
		return "", err
	}
	return decision, nil
}

// TestRunner: which commands a Runner sends, call after call, for each way
// a server answers.
func TestRunner(t *testing.T) {
	var (
		fcall       = "FCALL " + redisscript.Functions.Functions[0]
		eval        = "EVALSHA tokenbucket"
		missing     = errors.New("ERR Function not found")
		exists      = errors.New("ERR Library '" + redisscript.Functions.Name + "' already exists")
		otherExists = errors.New("ERR Library 'sluice_0000000000000000' already exists")
		unknown     = errors.New("ERR unknown command 'FUNCTION', with args beginning with: 'LOAD' ")
		unknownCall = errors.New("ERR unknown command 'FCALL', with args beginning with: ")
		noPerm      = errors.New("NOPERM User limiter has no permissions to run the 'function|load' command")
		down        = errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
		keyWords    = errors.New("sluice: key {ERR unknown command ERR Function not found} holds a value sluice did not write")
	)
	for _, tc := range []struct {
		name          string
		client        fakeClient
		calls         int
		want          []string
		wantErr       error // of the first call; later ones succeed
		wantEvalOnly  bool
		wantFirstFail bool
	}{
		{"loaded", fakeClient{}, 2, []string{fcall, fcall}, nil, false, false},
		{"missing, loaded", fakeClient{fcall: []error{missing}}, 2,
			[]string{fcall, "FUNCTION LOAD", fcall, fcall}, nil, false, false},
		// rueidis drops the error code ERR from the message.
		{"missing, loaded, without ERR", fakeClient{fcall: []error{errors.New("Function not found")}}, 1,
			[]string{fcall, "FUNCTION LOAD", fcall}, nil, false, false},
		{"FUNCTION renamed, without ERR", fakeClient{fcall: []error{errors.New("Function not found")}, load: []error{errors.New("unknown command 'FUNCTION', with args beginning with: 'LOAD' ")}}, 1,
			[]string{fcall, "FUNCTION LOAD", eval}, nil, true, false},
		{"missing, loaded by another process meanwhile", fakeClient{fcall: []error{missing}, load: []error{exists}}, 1,
			[]string{fcall, "FUNCTION LOAD", fcall}, nil, false, false},
		{"another library's name is taken", fakeClient{fcall: []error{missing}, load: []error{otherExists}}, 1,
			[]string{fcall, "FUNCTION LOAD"}, otherExists, false, true},
		{"FUNCTION renamed", fakeClient{fcall: []error{missing}, load: []error{unknown}}, 3,
			[]string{fcall, "FUNCTION LOAD", eval, eval, eval}, nil, true, false},
		{"FUNCTION denied by an ACL", fakeClient{fcall: []error{missing}, load: []error{noPerm}}, 2,
			[]string{fcall, "FUNCTION LOAD", eval, eval}, nil, true, false},
		{"no FCALL (Redis 6)", fakeClient{fcall: []error{unknownCall}}, 2,
			[]string{fcall, eval, eval}, nil, true, false},
		{"server down", fakeClient{fcall: []error{down}}, 2, []string{fcall, fcall}, down, false, true},
		// A key's words in a script's error are not the server's.
		{"a key that reads like a refusal", fakeClient{fcall: []error{keyWords}}, 2,
			[]string{fcall, fcall}, keyWords, false, true},
		{"load fails", fakeClient{fcall: []error{missing}, load: []error{down}}, 2,
			[]string{fcall, "FUNCTION LOAD", fcall}, down, false, true},
		{"script fails", fakeClient{fcall: []error{unknownCall}, eval: []error{down}}, 2,
			[]string{fcall, eval, eval}, down, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := redisscript.NewRunner(&tc.client)
			call := redisscript.NewCall("", "k", ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(10)}},
				ratelimit.Request{Op: ratelimit.Consume, Tokens: 1}, redisscript.ServerClock)
			for i := range tc.calls {
				reply, err := r.Run(context.Background(), call)
				if i == 0 && tc.wantFirstFail {
					if !errors.Is(err, tc.wantErr) {
						t.Fatalf("call 1: %v, %v; want %v", reply, err, tc.wantErr)
					}
					continue
				}
				if err != nil || reply != decision {
					t.Fatalf("call %d: %v, %v; want %v", i+1, reply, err, decision)
				}
			}
			if !slices.Equal(tc.client.sent, tc.want) {
				t.Errorf("sent\n\t%s\nwant\n\t%s", strings.Join(tc.client.sent, "\n\t"), strings.Join(tc.want, "\n\t"))
			}
			if r.EvalOnly() != tc.wantEvalOnly {
				t.Errorf("EvalOnly() = %v; want %v", r.EvalOnly(), tc.wantEvalOnly)
			}
		})
	}
}

// TestRunnerLoaded: what Check's loads on each server make of a Runner.
func TestRunnerLoaded(t *testing.T) {
	down := errors.New("i/o timeout")
	for _, tc := range []struct {
		err          error
		want         error
		wantEvalOnly bool
	}{
		{nil, nil, false},
		{errors.New("ERR Library '" + redisscript.Functions.Name + "' already exists"), nil, false},
		{errors.New("READONLY You can't write against a read only replica."), nil, false},
		{errors.New("ERR unknown command 'FUNCTION', with args beginning with: 'LOAD' "), nil, true},
		{down, down, false},
	} {
		r := redisscript.NewRunner(&fakeClient{})
		if err := r.Loaded(tc.err); err != tc.want || r.EvalOnly() != tc.wantEvalOnly {
			t.Errorf("Loaded(%v) = %v, EvalOnly %v; want %v, %v", tc.err, err, r.EvalOnly(), tc.want, tc.wantEvalOnly)
		}
	}
}

// TestLibraryNames: the library's and functions' names carry the source's
// hash, and the source names the library.
func TestLibraryNames(t *testing.T) {
	lib := redisscript.Functions
	if len(lib.Name) != len("sluice_")+16 || !strings.HasPrefix(lib.Name, "sluice_") {
		t.Errorf("library name %q; want sluice_ and 16 hex digits", lib.Name)
	}
	if !strings.HasPrefix(lib.Source, "#!lua name="+lib.Name+"\n") {
		t.Errorf("library source starts %q; want its name", lib.Source[:40])
	}
	if len(lib.Functions) != len(redisscript.Scripts) {
		t.Fatalf("%d functions for %d scripts", len(lib.Functions), len(redisscript.Scripts))
	}
	for i, fn := range lib.Functions {
		if want := lib.Name + "_" + redisscript.Scripts[i].Name; fn != want {
			t.Errorf("function %d is %q; want %q", i, fn, want)
		}
		if !strings.Contains(lib.Source, "redis.register_function('"+fn+"'") {
			t.Errorf("the library does not register %q", fn)
		}
	}
}
