package httplimit

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// A Rejection is a request the middleware answers itself, for a
// [WithBody] function to write the body of.
type Rejection struct {
	// Status is http.StatusTooManyRequests when the limit denied the
	// request, and http.StatusServiceUnavailable when the limiter could not
	// decide: the store failed with no fail policy, a fail policy failed
	// closed, or the key was refused (ratelimit.ErrKeyRejected).
	// http.StatusInternalServerError means the limiter was misused (a
	// config or key it rejects as invalid, a Backend that holds no
	// permits), and [Rejection.Err] says how. A request the concurrency
	// limit refused ([Rejection.TooManyInFlight]) has 429, or 503 by
	// [WithConcurrencyStatus].
	Status int
	// RetryAfter is the Retry-After header's value, in whole seconds
	// (at least 1), for 429 and 503.
	RetryAfter int64
	// Decision is the rate limit's decision; the zero value when Err is
	// set or there is no rate limit. When the concurrency limit refused
	// the request, it is the rate limit's, which allowed it.
	Decision ratelimit.Decision
	// Err is why the limiter could not decide, or nil. It is for logs: the
	// default bodies do not show it, as it may name keys and servers.
	Err error
	// Policies are the names of the quota policies the request exceeded, as
	// the RateLimit-Policy field names them (the binding bandwidth), for
	// a 429.
	Policies []string
	// TooManyInFlight reports that the concurrency limit refused the
	// request (see [WithConcurrency]): its key had every permit held.
	TooManyInFlight bool
	// Permit is the concurrency limit's decision when it refused the
	// request: TooManyInFlight (the store's refusal, or a fail policy's
	// Local share full), or a fail policy's Degraded refusal without a
	// count, InFlight 0 (503); the zero value otherwise. Its InFlight and
	// Limit are the permits held and the most that may be.
	Permit ratelimit.PermitDecision
}

// The problem types of RFC 9457 bodies (see [WithProblemDetails]): the
// draft's quota-exceeded for 429, and the plain HTTP status otherwise.
const (
	ProblemQuotaExceeded = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	problemTitleQuota    = "Request cannot be satisfied as assigned quota has been exceeded"
	problemBlank         = "about:blank"
)

// errorBody is the default JSON body, the shape Spring Boot and many API
// gateways use.
type errorBody struct {
	Timestamp string `json:"timestamp"`
	Status    int    `json:"status"`
	Error     string `json:"error"`
	Message   string `json:"message"`
	Path      string `json:"path"`
}

// problemBody is an RFC 9457 problem.
type problemBody struct {
	Type             string   `json:"type"`
	Title            string   `json:"title"`
	Status           int      `json:"status"`
	Detail           string   `json:"detail"`
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
}

// message says what happened, in words a client's developer can act on,
// without the limiter's internals.
func (rej Rejection) message() string {
	switch {
	case rej.TooManyInFlight && rej.Status == http.StatusTooManyRequests:
		return "too many requests in flight: retry in " + strconv.FormatInt(rej.RetryAfter, 10) + " s"
	case rej.TooManyInFlight:
		return "the server is at capacity: retry in " + strconv.FormatInt(rej.RetryAfter, 10) + " s"
	}
	switch rej.Status {
	case http.StatusTooManyRequests:
		return "rate limit exceeded: retry in " + strconv.FormatInt(rej.RetryAfter, 10) + " s"
	case http.StatusServiceUnavailable:
		return "the rate limiter cannot decide right now: retry in " + strconv.FormatInt(rej.RetryAfter, 10) + " s"
	default:
		return "the rate limiter is misconfigured"
	}
}

// writeJSONBody is the default body.
func writeJSONBody(w http.ResponseWriter, r *http.Request, rej Rejection) {
	writeJSON(w, "application/json", rej.Status, errorBody{
		Timestamp: time.Now().UTC().Format(time.RFC3339Nano),
		Status:    rej.Status,
		Error:     http.StatusText(rej.Status),
		Message:   rej.message(),
		Path:      r.URL.Path,
	})
}

// writeProblemBody is the RFC 9457 body of [WithProblemDetails].
func writeProblemBody(w http.ResponseWriter, _ *http.Request, rej Rejection) {
	p := problemBody{Type: problemBlank, Title: http.StatusText(rej.Status), Status: rej.Status, Detail: rej.message()}
	if rej.Status == http.StatusTooManyRequests && !rej.TooManyInFlight {
		p.Type, p.Title, p.ViolatedPolicies = ProblemQuotaExceeded, problemTitleQuota, rej.Policies
	}
	writeJSON(w, "application/problem+json", rej.Status, p)
}

func writeJSON(w http.ResponseWriter, contentType string, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil { // not for these structs of strings and ints
		http.Error(w, http.StatusText(status), status)
		return
	}
	h := w.Header()
	h.Set("Content-Type", contentType)
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
