// Package oncall is a documentation run, not a library: TestOnCallRun
// drives a limiter over a real Redis through three incidents (abuse, a
// limit set too low, a sick store), scrapes it with a real Prometheus, and
// renders the PromQL of docs/observability.md's "On call" section as the
// figures and figures' numbers under docs/. It is a module of its own so
// that its plotting dependency stays out of the otel module. Run it with
// run.sh.
package oncall
