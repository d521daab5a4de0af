package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"mime"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/ratelimit"
)

// maxPlanBody is the largest PUT /api/plans/{name} body accepted, in bytes:
// a plan's four fields take well under a hundred.
const maxPlanBody = 4 << 10

// The fields of a plan in the control endpoint's JSON, in the order they
// are checked.
const (
	fieldAlgorithm    = "algorithm"
	fieldCapacity     = "capacity"
	fieldRefillTokens = "refill_tokens"
	fieldRefillPeriod = "refill_period"
)

var planFields = []string{fieldAlgorithm, fieldCapacity, fieldRefillTokens, fieldRefillPeriod}

// algorithms are the algorithms a plan may use, by name, for the page's
// form and the error that lists them.
var algorithms = []ratelimit.Algorithm{
	ratelimit.TokenBucket, ratelimit.GCRA, ratelimit.FixedWindow,
	ratelimit.SlidingWindowLog, ratelimit.SlidingWindowCounter, ratelimit.LeakyBucket,
}

// planJSON is a plan as GET and PUT /api/plans answer it.
type planJSON struct {
	Name string `json:"name"`
	// Revision counts the plan's revisions: 1 as the demo starts, 2 after
	// the first edit.
	Revision uint64 `json:"revision"`
	// Version is the plan's version, which buckets compare (GET /api/hello
	// answers it as plan_version). One counter draws the versions of every
	// plan and assignment, so a plan's versions skip numbers.
	Version      uint64 `json:"version"`
	Subject      string `json:"subject"`
	Algorithm    string `json:"algorithm"`
	Capacity     int64  `json:"capacity"`
	RefillTokens int64  `json:"refill_tokens"`
	RefillPeriod string `json:"refill_period"`
}

// fieldError is one field of a request that is wrong.
type fieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// errorJSON is the body of every error the demo's own endpoints answer:
// a message, the first field at fault, and every field at fault.
type errorJSON struct {
	Error  string       `json:"error"`
	Field  string       `json:"field,omitempty"`
	Errors []fieldError `json:"errors,omitempty"`
}

// planAPI serves the control endpoint: it reads and revises the demo
// plans in store, which tells the plan cache, so a revision applies on the
// next request.
type planAPI struct {
	store     *revisionStore
	storeKind string
}

// plansJSON is GET /api/plans's answer.
type plansJSON struct {
	// Store says where the buckets live: "memory", "redis" or "redis cluster".
	Store string     `json:"store"`
	Plans []planJSON `json:"plans"`
	// Algorithms lists the algorithms a plan may use.
	Algorithms []string `json:"algorithms"`
}

// list serves GET /api/plans: every demo plan as it is now.
func (a planAPI) list(w http.ResponseWriter, r *http.Request) {
	out := plansJSON{Store: a.storeKind, Plans: make([]planJSON, 0, len(demoPlans)), Algorithms: algorithmList()}
	for _, p := range demoPlans {
		pj, err := a.current(r, p)
		if err != nil {
			writeJSON(w, http.StatusInternalServerError, errorJSON{Error: err.Error()})
			return
		}
		out.Plans = append(out.Plans, pj)
	}
	writeJSON(w, http.StatusOK, out)
}

// current reads p as the store holds it.
func (a planAPI) current(r *http.Request, p demoPlan) (planJSON, error) {
	asg, revision, err := a.store.lookup(r.Context(), p.subject)
	if err != nil {
		return planJSON{}, err
	}
	if asg.Plan.Name != p.name || len(asg.Plan.Bandwidths) != 1 {
		return planJSON{}, fmt.Errorf("subject %q is not on plan %q", p.subject, p.name)
	}
	return toJSON(asg.Plan, revision, p.subject), nil
}

func toJSON(p plans.Plan, revision uint64, subject string) planJSON {
	bw := p.Bandwidths[0]
	return planJSON{
		Name:         p.Name,
		Revision:     revision,
		Version:      p.Version,
		Subject:      subject,
		Algorithm:    p.Algorithm.String(),
		Capacity:     bw.Capacity,
		RefillTokens: bw.RefillTokens,
		RefillPeriod: bw.RefillPeriod.String(),
	}
}

// put serves PUT /api/plans/{name}: it revises the plan with the limit in
// the body, a JSON object of the four plan fields, all required:
//
//	{"algorithm":"GCRA","capacity":20,"refill_tokens":5,"refill_period":"1s"}
//
// A bad body is a 400 naming each field at fault, and changes nothing.
func (a planAPI) put(w http.ResponseWriter, r *http.Request) {
	p, ok := findPlan(r.PathValue("name"))
	if !ok {
		writeJSON(w, http.StatusNotFound, errorJSON{
			Error: fmt.Sprintf("no plan named %q: the demo's plans are %s", r.PathValue("name"), planNames()),
			Field: "name",
		})
		return
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		writeJSON(w, http.StatusUnsupportedMediaType, errorJSON{Error: "Content-Type must be application/json"})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxPlanBody))
	if err != nil {
		if _, tooLarge := errors.AsType[*http.MaxBytesError](err); tooLarge {
			writeJSON(w, http.StatusRequestEntityTooLarge, errorJSON{Error: fmt.Sprintf("request body larger than %d bytes", maxPlanBody)})
			return
		}
		writeJSON(w, http.StatusBadRequest, errorJSON{Error: "reading the request body: " + err.Error()})
		return
	}
	l, errs := parseLimit(body)
	if len(errs) == 0 {
		errs = checkConfig(l.config(p.name))
	}
	if len(errs) > 0 {
		writeJSON(w, http.StatusBadRequest, errorJSON{Error: errs[0].Message, Field: errs[0].Field, Errors: errs})
		return
	}
	plan, revision, err := a.store.revise(p.name, l.config(p.name))
	if err != nil { // checkConfig accepted it, so this is not the caller's fault
		writeJSON(w, http.StatusInternalServerError, errorJSON{Error: err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, toJSON(plan, revision, p.subject))
}

// parseLimit reads a limit from a JSON object of the plan fields, each
// required once, with nothing else. The errors name each field at fault.
func parseLimit(body []byte) (limit, []fieldError) {
	raw, err := decodeObject(body)
	if err != nil {
		return limit{}, []fieldError{{Message: "the body must be a JSON object with the fields " + strings.Join(planFields, ", ") + ": " + err.Error()}}
	}
	var l limit
	var errs []fieldError
	fail := func(field, format string, args ...any) {
		errs = append(errs, fieldError{Field: field, Message: field + " " + fmt.Sprintf(format, args...)})
	}
	for _, f := range planFields {
		v, ok := raw[f]
		if !ok {
			fail(f, "is missing")
			continue
		}
		switch f {
		case fieldAlgorithm:
			var s string
			if json.Unmarshal(v, &s) != nil {
				fail(f, "must be a string, one of %s", algorithmNames())
			} else if l.Algorithm, err = plans.ParseAlgorithm(s); err != nil {
				fail(f, "%q is not one of %s", s, algorithmNames())
			}
		case fieldCapacity, fieldRefillTokens:
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil || n < 1 || n > ratelimit.MaxCapacity {
				fail(f, "must be a whole number from 1 to %d, got %s", int64(ratelimit.MaxCapacity), v)
			} else if f == fieldCapacity {
				l.Capacity = n
			} else {
				l.RefillTokens = n
			}
		case fieldRefillPeriod:
			var s string
			if json.Unmarshal(v, &s) != nil {
				fail(f, `must be a duration string such as "1s", "250ms" or "1m30s", got %s`, v)
			} else if l.RefillPeriod, err = time.ParseDuration(s); err != nil || l.RefillPeriod <= 0 {
				fail(f, `must be a positive duration such as "1s", "250ms" or "1m30s", got %q`, s)
			}
		}
	}
	for _, f := range slices.Sorted(maps.Keys(raw)) {
		if !slices.Contains(planFields, f) {
			fail(f, "is not a plan field: the fields are %s", strings.Join(planFields, ", "))
		}
	}
	return l, errs
}

// decodeObject reads body as one JSON object, refusing repeated keys and
// anything after the object.
func decodeObject(body []byte) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New("not an object")
	}
	raw := make(map[string]json.RawMessage)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, ok := tok.(string) // inside an object, the token before a value is its key
		if !ok {
			return nil, errors.New("not an object")
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("field %q: %w", key, err)
		}
		if _, dup := raw[key]; dup {
			return nil, fmt.Errorf("field %q repeats", key)
		}
		raw[key] = v
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("data after the object")
	}
	return raw, nil
}

// configField finds the bandwidth field a ratelimit.Config.Validate error
// names: "...: Bandwidths[0].RefillTokens must equal Capacity ...".
var configField = regexp.MustCompile(`Bandwidths\[0\]\.(Capacity|RefillTokens|RefillPeriod)`)

// checkConfig applies the rules that relate the fields to each other and
// to the algorithm (a window admits Capacity per period, so its
// RefillTokens must equal Capacity; exact arithmetic bounds the rest),
// naming the plan field at fault.
func checkConfig(cfg ratelimit.Config) []fieldError {
	err := cfg.Validate()
	if err == nil {
		return nil
	}
	field := fieldAlgorithm
	if m := configField.FindStringSubmatch(err.Error()); m != nil {
		field = map[string]string{
			"Capacity":     fieldCapacity,
			"RefillTokens": fieldRefillTokens,
			"RefillPeriod": fieldRefillPeriod,
		}[m[1]]
	}
	return []fieldError{{Field: field, Message: field + ": " + err.Error()}}
}

func algorithmList() []string {
	names := make([]string, len(algorithms))
	for i, a := range algorithms {
		names[i] = a.String()
	}
	return names
}

func algorithmNames() string { return strings.Join(algorithmList(), ", ") }

func planNames() string {
	names := make([]string, len(demoPlans))
	for i, p := range demoPlans {
		names[i] = strconv.Quote(p.name)
	}
	return strings.Join(names, ", ")
}

// writeJSON writes v as the JSON body of a response with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
