package ratelimit

import (
	"slices"
	"time"
)

// StaleRetry is the RetryAfter of a call that [Apply] cannot decide on the
// bucket's newer config (see there): about how long a replica on an old
// plan takes to see the new one.
const StaleRetry = time.Second

// holdsNewer reports whether s, live at now, was built for a later version
// than cfg's.
func (s *State) holdsNewer(cfg *Config, now int64) bool {
	return cfg.Version < s.Version && s.Config != nil && len(s.Bands) > 0 && now < s.ExpiresAt
}

// applyStale decides a call whose config, caller, is older than s's, on
// s's config.
func (s *State) applyStale(d *Decision, caller *Config, req Request, now int64) {
	cfg := *s.Config
	if !cfg.accepts(caller, req) {
		*d = staleDenial(caller)
		return
	}
	if req.Op == Replace {
		req.Op = Inspect
	}
	applyAs(d, s, &cfg, &req, now)
	d.Bandwidth = bandName(caller.Bandwidths, callerBand(caller, &cfg, d.Bandwidth))
}

// accepts reports whether a stale call with the caller's config and req can
// be decided on c: the same algorithm, and a request valid for c.
func (c Config) accepts(caller *Config, req Request) bool {
	if c.Algorithm != caller.Algorithm || !c.Algorithm.Supports(req.Op) {
		return false
	}
	switch req.Op {
	case Consume, Estimate, Reserve:
		return req.Tokens <= c.MinCapacity()
	}
	return true
}

// staleDenial is the decision on a stale call that cannot be decided on
// the bucket's config: denied, taking nothing.
func staleDenial(caller *Config) Decision {
	return Decision{
		Limit:       caller.Bandwidths[0].Capacity,
		RetryAfter:  StaleRetry,
		ResetAfter:  StaleRetry,
		RefillAfter: StaleRetry,
		Bandwidth:   bandName(caller.Bandwidths, 0),
	}
}

// callerBand returns the index of the caller's bandwidth that matches cfg's
// bandwidth named name: the one with its ID, or, for a bandwidth without
// one, the caller's at its position if that has none either; 0 if none
// does.
func callerBand(caller, cfg *Config, name string) int {
	for j := range cfg.Bandwidths {
		if bandName(cfg.Bandwidths, j) != name {
			continue
		}
		id := cfg.Bandwidths[j].ID
		for i := range caller.Bandwidths {
			if caller.Bandwidths[i].ID == id && (id != "" || i == j) {
				return i
			}
		}
		break
	}
	return 0
}

// keepConfig records in s the version of cfg, which built or converted it,
// and for a versioned cfg a copy of it, made only when it changed.
func (s *State) keepConfig(cfg *Config) {
	s.Version = cfg.Version
	if cfg.Version == 0 {
		s.Config = nil
		return
	}
	if s.Config != nil && s.Config.Version == cfg.Version && s.configFP == s.Fingerprint && s.Config.Algorithm == s.Algorithm {
		return
	}
	c := *cfg
	c.Bandwidths = slices.Clone(cfg.Bandwidths)
	for i := range c.Bandwidths {
		if b := &c.Bandwidths[i]; b.InitialTokens != nil {
			n := *b.InitialTokens
			b.InitialTokens = &n
		}
	}
	s.Config, s.configFP = &c, s.Fingerprint
}
