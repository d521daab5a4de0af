// Package grpclimit is sluice's gRPC server middleware: unary and stream
// interceptors that decide each call with a [ratelimit.Limiter] before its
// handler runs, limiting its rate, the calls in flight at once, or both.
//
//	lim, err := grpclimit.New(limiter,
//		grpclimit.WithKey(byAPIKey),
//		grpclimit.WithConfig(ratelimit.Config{Bandwidths: []ratelimit.Bandwidth{ratelimit.PerSecond(100)}}),
//		grpclimit.WithConcurrency(ratelimit.InFlight(8, 30*time.Second)))
//	srv := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(lim.UnaryServerInterceptor()),
//		grpc.ChainStreamInterceptor(lim.StreamServerInterceptor()))
//
// It is a module of its own, so that a service that does not serve gRPC
// does not get google.golang.org/grpc in its build.
//
// # Keys
//
// A call's bucket, and its permits, are at the key a [KeyFunc] returns
// from its context (metadata, peer, what an authentication interceptor
// found) and its method: by default [PeerKey], each method's calls from
// each peer address. [WithConcurrencyKey] gives the permits a key of their
// own, to limit what many callers share.
//
// # Refusals
//
// A refused call ends with codes.ResourceExhausted and a google.rpc.RetryInfo
// detail saying when to retry, which gRPC clients and their retry policies
// read:
//
//	st := status.Convert(err)
//	for _, d := range st.Details() {
//		if ri, ok := d.(*errdetails.RetryInfo); ok {
//			wait := ri.GetRetryDelay().AsDuration()
//		}
//	}
//
// The rate limit's decisions also send draft-10's RateLimit and
// RateLimit-Policy fields as response header metadata, written as
// [httplimit.HeaderWriter] writes them for HTTP.
//
// # Concurrency
//
// A unary call holds its permit while its handler runs; a stream, until
// its handler returns. A call that outlasts a third of its permit's lease
// has it renewed until it ends, so that a stream may run for hours on a
// lease of seconds, and the permit is released however the handler ends:
// it returns, fails or panics. gRPC does not recover a handler's panic
// (the process ends unless an interceptor outside this one recovers it);
// the permit goes back first, then the panic goes on up.
//
// # Errors
//
// Options are checked by [New], which names the option that does not
// hold. When the limiter cannot decide, a call is refused with
// codes.Unavailable (fail closed) unless [WithFailOpen] lets it through; a
// call's own cancellation or deadline is never taken for the store
// failing. See [New] for every code.
package grpclimit
