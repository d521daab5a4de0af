package httplimit

import "context"

// A Caller is who a request is from, as the service's authentication layer
// established it. The middleware keys the bucket by the first of APIKey,
// Principal and the client address that it has, and looks up the plan of
// Tenant (or, without one, of the key or principal).
//
// Put only validated identities here: whatever a caller can choose freely
// it can change on every request, and so get a new bucket each time.
type Caller struct {
	// Tenant is the customer account the request is on behalf of: the
	// subject of its plan. "" for none.
	Tenant string
	// APIKey is the ID of the API key the request was authenticated with,
	// never the secret itself.
	APIKey string
	// Principal is the authenticated user or service, when the request
	// carries no API key (a session, a JWT's subject).
	Principal string
}

// AnonymousSubject is the plan subject of a request with no Caller (or an
// empty one): assign it a plan in the store to set the limits of anonymous
// clients, each of whom is keyed by address. Without an assignment the
// cache's default plan applies.
const AnonymousSubject = "anonymous"

type callerKey struct{}

// ContextWithCaller returns a copy of ctx that carries c, for the
// middleware to key the request's bucket by. The authentication layer calls
// it before the middleware runs.
func ContextWithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerFromContext returns the Caller that [ContextWithCaller] put in ctx.
func CallerFromContext(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

// Subject is whose plan applies to c's requests under [WithPlans]: its
// Tenant, else its APIKey, else its Principal, else [AnonymousSubject].
func (c Caller) Subject() string {
	switch {
	case c.Tenant != "":
		return c.Tenant
	case c.APIKey != "":
		return c.APIKey
	case c.Principal != "":
		return c.Principal
	}
	return AnonymousSubject
}
