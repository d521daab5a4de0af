package main

import (
	"encoding/json"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// plan builds a PUT body from a valid one with fields replaced: a value of
// "" drops the field, any other is its raw JSON.
func plan(fields ...string) string {
	f := map[string]string{
		"algorithm":     `"TokenBucket"`,
		"capacity":      "10",
		"refill_tokens": "1",
		"refill_period": `"1s"`,
	}
	for i := 0; i+1 < len(fields); i += 2 {
		f[fields[i]] = fields[i+1]
	}
	var b strings.Builder
	b.WriteByte('{')
	for _, k := range append(append([]string(nil), planFields...), extraFields(f)...) {
		v, ok := f[k]
		if !ok || v == "" {
			continue
		}
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		b.WriteString(`"` + k + `":` + v)
	}
	b.WriteByte('}')
	return b.String()
}

// extraFields are the fields of f that are not plan fields, sorted.
func extraFields(f map[string]string) []string {
	var extra []string
	for _, k := range slices.Sorted(maps.Keys(f)) {
		if !slices.Contains(planFields, k) {
			extra = append(extra, k)
		}
	}
	return extra
}

func TestPutPlanRejectsBadInput(t *testing.T) {
	for _, tc := range []struct {
		name        string
		plan        string // default "free"
		contentType string // default application/json
		body        string
		status      int    // default 400
		field       string // the first field named
	}{
		{name: "unknown plan", plan: "gold", body: plan(), status: http.StatusNotFound, field: "name"},
		{name: "not JSON content", contentType: "text/plain", body: plan(), status: http.StatusUnsupportedMediaType},
		{name: "no content type", contentType: "-", body: plan(), status: http.StatusUnsupportedMediaType},
		{name: "body too large", body: plan() + strings.Repeat(" ", maxPlanBody), status: http.StatusRequestEntityTooLarge},
		{name: "not JSON", body: "algorithm=GCRA"},
		{name: "empty body", body: ""},
		{name: "array", body: "[" + plan() + "]"},
		{name: "data after the object", body: plan() + "{}"},
		{name: "repeated field", body: `{"capacity":1,"capacity":2}`},

		{name: "algorithm missing", body: plan("algorithm", ""), field: "algorithm"},
		{name: "algorithm unknown", body: plan("algorithm", `"Bucket"`), field: "algorithm"},
		{name: "algorithm in lower case", body: plan("algorithm", `"gcra"`), field: "algorithm"},
		{name: "algorithm a number", body: plan("algorithm", "1"), field: "algorithm"},
		{name: "algorithm null", body: plan("algorithm", "null"), field: "algorithm"},

		{name: "capacity missing", body: plan("capacity", ""), field: "capacity"},
		{name: "capacity zero", body: plan("capacity", "0"), field: "capacity"},
		{name: "capacity negative", body: plan("capacity", "-5"), field: "capacity"},
		{name: "capacity a fraction", body: plan("capacity", "1.5"), field: "capacity"},
		{name: "capacity an exponent", body: plan("capacity", "1e3"), field: "capacity"},
		{name: "capacity a string", body: plan("capacity", `"10"`), field: "capacity"},
		{name: "capacity over 2^50", body: plan("capacity", "1125899906842625"), field: "capacity"},
		{name: "capacity over int64", body: plan("capacity", "99999999999999999999"), field: "capacity"},
		{name: "capacity too big for a log", body: plan("algorithm", `"SlidingWindowLog"`, "capacity", "20000", "refill_tokens", "20000"), field: "capacity"},

		{name: "refill_tokens missing", body: plan("refill_tokens", ""), field: "refill_tokens"},
		{name: "refill_tokens zero", body: plan("refill_tokens", "0"), field: "refill_tokens"},
		{name: "refill_tokens faster than 1/µs", body: plan("refill_tokens", "1000", "refill_period", `"100µs"`), field: "refill_tokens"},
		{name: "refill_tokens not capacity for a window", body: plan("algorithm", `"FixedWindow"`), field: "refill_tokens"},

		{name: "refill_period missing", body: plan("refill_period", ""), field: "refill_period"},
		{name: "refill_period not a duration", body: plan("refill_period", `"soon"`), field: "refill_period"},
		{name: "refill_period a number", body: plan("refill_period", "1000"), field: "refill_period"},
		{name: "refill_period zero", body: plan("refill_period", `"0s"`), field: "refill_period"},
		{name: "refill_period negative", body: plan("refill_period", `"-1s"`), field: "refill_period"},
		{name: "refill_period under a µs", body: plan("refill_period", `"999ns"`), field: "refill_period"},
		{name: "refill_period not whole µs", body: plan("refill_period", `"1500ns"`), field: "refill_period"},
		{name: "refill_period over 366 days", body: plan("refill_period", `"8785h"`), field: "refill_period"},

		{name: "unknown field", body: plan("burst", "5"), field: "burst"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, srv := newTestServer(t)
			before := plansNow(t, srv)
			policyBefore := do(t, srv, http.MethodGet, "/api/hello", "", keyFree).header.Get("RateLimit-Policy")

			name, contentType, status := tc.plan, tc.contentType, tc.status
			if name == "" {
				name = "free"
			}
			var headers []string
			switch contentType {
			case "":
				headers = append(headers, "Content-Type: application/json")
			case "-":
			default:
				headers = append(headers, "Content-Type: "+contentType)
			}
			if status == 0 {
				status = http.StatusBadRequest
			}
			r := do(t, srv, http.MethodPut, "/api/plans/"+name, tc.body, headers...)
			if r.status != status {
				t.Fatalf("PUT %s: got %d %s, want %d", tc.body, r.status, r.body, status)
			}
			var e errorJSON
			if err := json.Unmarshal([]byte(r.body), &e); err != nil || e.Error == "" {
				t.Fatalf("error body %q: want JSON with an error", r.body)
			}
			if e.Field != tc.field {
				t.Errorf("field: got %q (%s), want %q", e.Field, e.Error, tc.field)
			}
			if tc.field != "" && tc.field != "name" && !strings.Contains(e.Error, tc.field) {
				t.Errorf("message %q does not name the field %q", e.Error, tc.field)
			}

			if after := plansNow(t, srv); !reflect.DeepEqual(after, before) {
				t.Errorf("plans changed by a bad PUT:\nbefore %+v\nafter  %+v", before, after)
			}
			if got := do(t, srv, http.MethodGet, "/api/hello", "", keyFree).header.Get("RateLimit-Policy"); got != policyBefore {
				t.Errorf("RateLimit-Policy after a bad PUT: got %q, want %q as before", got, policyBefore)
			}
		})
	}
}

func TestPutPlanNamesEveryBadField(t *testing.T) {
	_, srv := newTestServer(t)
	r := putPlan(t, srv, "pro", `{"algorithm":"Nope","capacity":0,"refill_tokens":"x","refill_period":"soon","extra":1}`)
	var e errorJSON
	if err := json.Unmarshal([]byte(r.body), &e); r.status != http.StatusBadRequest || err != nil {
		t.Fatalf("got %d %s, want 400", r.status, r.body)
	}
	var fields []string
	for _, fe := range e.Errors {
		fields = append(fields, fe.Field)
		if !strings.HasPrefix(fe.Message, fe.Field+" ") {
			t.Errorf("message %q does not start with its field", fe.Message)
		}
	}
	if want := []string{"algorithm", "capacity", "refill_tokens", "refill_period", "extra"}; !reflect.DeepEqual(fields, want) {
		t.Errorf("fields named: got %v, want %v", fields, want)
	}
}

func TestPutPlanRevises(t *testing.T) {
	_, srv := newTestServer(t)
	before := plansNow(t, srv)
	r := putPlan(t, srv, "anonymous", `{"algorithm":"SlidingWindowLog","capacity":3,"refill_tokens":3,"refill_period":"1m30s"}`)
	var got planJSON
	if err := json.Unmarshal([]byte(r.body), &got); r.status != http.StatusOK || err != nil {
		t.Fatalf("PUT: %d %s", r.status, r.body)
	}
	want := planJSON{Name: "anonymous", Subject: "anonymous", Algorithm: "SlidingWindowLog",
		Capacity: 3, RefillTokens: 3, RefillPeriod: "1m30s", Revision: 2, Version: got.Version}
	if got != want {
		t.Errorf("PUT answered %+v, want %+v", got, want)
	}
	for _, p := range before.Plans {
		if p.Name == "anonymous" && got.Version <= p.Version {
			t.Errorf("version %d, not above the plan's %d", got.Version, p.Version)
		}
	}
	if now := plansNow(t, srv).Plans[2]; now != got {
		t.Errorf("GET /api/plans: %+v, want %+v", now, got)
	}
}

// TestPlanRevisions: each plan counts its own revisions, while its version
// comes from the counter of every plan and assignment, as the page's hint
// says: the plans start at versions 1, 3 and 5, and the first edit takes 7.
func TestPlanRevisions(t *testing.T) {
	_, srv := newTestServer(t)
	var versions []uint64
	for _, p := range plansNow(t, srv).Plans {
		if p.Revision != 1 {
			t.Errorf("plan %s starts at revision %d, want 1", p.Name, p.Revision)
		}
		versions = append(versions, p.Version)
	}
	if want := []uint64{1, 3, 5}; !slices.Equal(versions, want) {
		t.Errorf("the plans start at versions %v, want %v as the page says", versions, want)
	}
	for i, want := range []struct{ revision, version uint64 }{{2, 7}, {3, 8}} {
		r := putPlan(t, srv, "free", plan("capacity", strconv.Itoa(20+i)))
		var got planJSON
		if err := json.Unmarshal([]byte(r.body), &got); r.status != http.StatusOK || err != nil {
			t.Fatalf("PUT: %d %s", r.status, r.body)
		}
		if got.Revision != want.revision || got.Version != want.version {
			t.Errorf("edit %d: revision %d at version %d, want revision %d at version %d", i+1, got.Revision, got.Version, want.revision, want.version)
		}
		if now := plansNow(t, srv).Plans[0]; now != got {
			t.Errorf("GET /api/plans after edit %d: %+v, want %+v", i+1, now, got)
		}
	}
	if pro := plansNow(t, srv).Plans[1]; pro.Revision != 1 {
		t.Errorf("pro after edits of free: revision %d, want 1", pro.Revision)
	}
	page, err := webFiles.ReadFile("web/index.html")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(strings.Fields(string(page)), " ")
	if !strings.Contains(text, "start at versions 1, 3 and 5, and the first edit takes 7") {
		t.Error("the page no longer says which versions the plans start at: update this test with it")
	}
}

// FuzzParseLimit checks that any body either names a field at fault or
// gives a limit in range, and never panics.
func FuzzParseLimit(f *testing.F) {
	f.Add(plan())
	f.Add(plan("algorithm", `"GCRA"`, "refill_period", `"1h30m"`))
	f.Add(`{"capacity":1e400}`)
	f.Add(`{"algorithm":"TokenBucket","capacity":-0,"refill_tokens":1,"refill_period":"1s"}`)
	f.Add(`{"":1}`)
	f.Add(`{`)
	f.Fuzz(func(t *testing.T, body string) {
		l, errs := parseLimit([]byte(body))
		if len(errs) > 0 {
			return
		}
		if l.Capacity < 1 || l.RefillTokens < 1 || l.RefillPeriod <= 0 || !slices.Contains(algorithms, l.Algorithm) {
			t.Fatalf("%s: accepted %+v", body, l)
		}
		for _, e := range checkConfig(l.config("free")) {
			if !slices.Contains(planFields, e.Field) {
				t.Fatalf("%s: the config's error %q names no plan field", body, e.Message)
			}
		}
	})
}
