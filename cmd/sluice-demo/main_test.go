package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the tests if any leaves a goroutine behind: the server,
// the limiter, the memory backend's sweep, the meter provider and the
// browser must all be closed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newTestServer starts the demo, in memory, behind an httptest server that
// the test's cleanup closes.
func newTestServer(t *testing.T) (*demo, *httptest.Server) {
	t.Helper()
	d, err := newDemo(t.Context(), options{listen: defaultListen}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d.handler)
	t.Cleanup(func() {
		srv.Close()
		if err := d.Close(context.Background()); err != nil {
			t.Errorf("closing the demo: %v", err)
		}
	})
	return d, srv
}

// testLogger logs to the test's log.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), nil))
}

// response is what a test keeps of one: status, headers and body.
type response struct {
	status int
	header http.Header
	body   string
}

// do sends a request to the demo with the given headers ("Name: value").
func do(t *testing.T, srv *httptest.Server, method, path, body string, headers ...string) response {
	t.Helper()
	r, err := send(t.Context(), srv, method, path, body, headers...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// send is do for goroutines other than the test's, which must not call
// t.Fatal.
func send(ctx context.Context, srv *httptest.Server, method, path, body string, headers ...string) (response, error) {
	req, err := http.NewRequestWithContext(ctx, method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		return response{}, err
	}
	for _, h := range headers {
		name, value, ok := strings.Cut(h, ": ")
		if !ok {
			return response{}, fmt.Errorf("header %q is not Name: value", h)
		}
		req.Header.Set(name, value)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return response{}, err
	}
	return response{status: resp.StatusCode, header: resp.Header, body: string(b)}, nil
}

// putPlan revises plan name with the JSON body.
func putPlan(t *testing.T, srv *httptest.Server, name, body string) response {
	t.Helper()
	return do(t, srv, http.MethodPut, "/api/plans/"+name, body, "Content-Type: application/json")
}

// mustPutPlan revises plan name and fails the test unless that works.
func mustPutPlan(t *testing.T, srv *httptest.Server, name, body string) {
	t.Helper()
	if r := putPlan(t, srv, name, body); r.status != http.StatusOK {
		t.Fatalf("PUT /api/plans/%s %s: %d %s", name, body, r.status, r.body)
	}
}

// burst sends n requests at once with the given headers and counts the
// answers by status. It returns one 429 response as an example.
func burst(t *testing.T, srv *httptest.Server, n int, headers ...string) (map[int]int, response) {
	t.Helper()
	var (
		mu       sync.Mutex
		statuses = map[int]int{}
		denied   response
		wg       sync.WaitGroup
	)
	for range n {
		wg.Go(func() {
			r, err := send(t.Context(), srv, http.MethodGet, "/api/hello", "", headers...)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			statuses[r.status]++
			if r.status == http.StatusTooManyRequests {
				denied = r
			}
		})
	}
	wg.Wait()
	return statuses, denied
}

// plansNow returns the plans as GET /api/plans answers them.
func plansNow(t *testing.T, srv *httptest.Server) plansJSON {
	t.Helper()
	r := do(t, srv, http.MethodGet, "/api/plans", "")
	if r.status != http.StatusOK {
		t.Fatalf("GET /api/plans: %d %s", r.status, r.body)
	}
	var p plansJSON
	if err := json.Unmarshal([]byte(r.body), &p); err != nil {
		t.Fatalf("GET /api/plans: %v in %s", err, r.body)
	}
	return p
}
