package ratelimit

import "time"

// PermitState is one key's permits, as a store keeps them: what
// [ApplyPermit] reads and changes. The zero value holds no permit. It is
// the reference the Redis script is tested against, and the memory
// backend's state.
type PermitState struct {
	// Holds maps each holder to its permit.
	Holds map[string]Hold
	// InFlight is the weights of Holds, summed.
	InFlight int64
	// nextExpiry is a time no later than the first lease's end, in µs:
	// ApplyPermit looks for ended leases only from then.
	nextExpiry int64
}

// Hold is one holder's permit.
type Hold struct {
	// Weight is the permits it holds.
	Weight int64
	// Expires is when its lease ends, in µs on the store's clock.
	Expires int64
}

// ApplyPermit applies req under lim to st at now (µs on the store's
// clock), as every store does: it first drops every hold whose lease has
// ended (Expires ≤ now), then acts as [PermitOp] says. lim and req must
// have passed [CheckPermit]. It allocates only to add a holder.
func ApplyPermit(st *PermitState, lim Concurrency, req PermitRequest, now int64) PermitDecision {
	st.reclaim(now)
	d := PermitDecision{Limit: lim.Limit}
	h, held := st.Holds[req.Holder]
	switch req.Op {
	case PermitAcquire:
		switch {
		case held:
			d.Granted = st.renew(req.Holder, h, now+lim.LeaseMicros())
		case st.InFlight+req.Weight <= lim.Limit:
			if st.Holds == nil {
				st.Holds = make(map[string]Hold)
			}
			expires := now + lim.LeaseMicros()
			st.Holds[req.Holder] = Hold{Weight: req.Weight, Expires: expires}
			st.InFlight += req.Weight
			st.nextExpiry = min(st.nextExpiry, expires)
			if len(st.Holds) == 1 {
				st.nextExpiry = expires
			}
			d.Granted = true
		default:
			d.RetryAfter = time.Duration(st.firstExpiry()-now) * time.Microsecond
		}
	case PermitRelease:
		if held {
			delete(st.Holds, req.Holder)
			st.InFlight -= h.Weight
			d.Granted = true
		}
	case PermitRenew:
		if held {
			d.Granted = st.renew(req.Holder, h, now+lim.LeaseMicros())
		}
	case PermitInspect:
		d.Granted = st.InFlight < lim.Limit
	}
	d.InFlight = st.InFlight
	return d
}

// renew moves holder's lease end to expires. A store's clock may step
// back, so the end may come earlier; nextExpiry is then lowered.
func (st *PermitState) renew(holder string, h Hold, expires int64) bool {
	h.Expires = expires
	st.Holds[holder] = h
	st.nextExpiry = min(st.nextExpiry, expires)
	return true
}

// reclaim drops the holds whose lease has ended at now.
func (st *PermitState) reclaim(now int64) {
	if len(st.Holds) == 0 || now < st.nextExpiry {
		return
	}
	for holder, h := range st.Holds {
		if h.Expires <= now {
			delete(st.Holds, holder)
			st.InFlight -= h.Weight
		}
	}
	st.nextExpiry = st.firstExpiry()
}

// firstExpiry is when the first lease held ends; 0 when none is held.
func (st *PermitState) firstExpiry() int64 {
	first := int64(0)
	for _, h := range st.Holds {
		if first == 0 || h.Expires < first {
			first = h.Expires
		}
	}
	return first
}

// ExpiresAt is when st comes to hold no permit, if none is acquired or
// renewed meanwhile: the last lease's end, in µs; 0 when none is held. A
// store may forget the key then.
func (st *PermitState) ExpiresAt() int64 {
	last := int64(0)
	for _, h := range st.Holds {
		last = max(last, h.Expires)
	}
	return last
}
