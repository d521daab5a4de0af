package ratelimit

import "slices"

// The sliding window log keeps in State.Log the time of every token taken,
// oldest first, one entry per token, and nothing else: an entry at t counts
// for bandwidth i while now < t + W_i, W_i being its RefillPeriod in µs, so
// bandwidth i holds the entries after now − W_i, a suffix of the log. A
// request for n passes if every bandwidth then holds at most its Capacity,
// and is logged as n entries at now. State.Bands holds each bandwidth's ID
// and Capacity, no more: the log is the whole count, and the new limits
// apply to it as they are when the config changes.
//
// The log holds at most logLimits' bound entries after every call: memory
// follows the limit, not the traffic. Each call first drops the entries
// the longest window no longer holds, then the oldest beyond the bound
// (which only a config change leaves).
//
// The clock may step back: entries after now still count in every window
// (they are after now − W_i), and new entries go in at their place in time
// order.

// applyLog is Apply for SlidingWindowLog.
func applyLog(d *Decision, s *State, cfg *Config, req *Request, now int64) {
	fp := cfg.Fingerprint()
	switch {
	case len(s.Bands) == 0 || req.Op == Reset || now >= s.ExpiresAt || s.Algorithm != cfg.Algorithm:
		s.rebuildLog(cfg, fp)
		s.Log = s.Log[:0]
	case req.Op == Replace || s.Fingerprint != fp:
		// The log carries over whole, whatever the strategy but ResetTokens:
		// it counts requests, which a strategy for tokens cannot scale.
		s.rebuildLog(cfg, fp)
		if req.Strategy == ResetTokens {
			s.Log = s.Log[:0]
		}
	}
	bws := cfg.Bandwidths
	longest, bound := logLimits(bws)
	s.trimLog(now-longest, bound)
	var counts logCounts
	s.countLog(&counts, bws, now)

	d.Allowed = true
	binding := -1 // the bandwidth with the fewest requests left
	switch req.Op {
	case Add:
		// A refund: the newest entries go.
		r := int(min(req.Tokens, int64(len(s.Log))))
		s.Log = s.Log[:len(s.Log)-r]
		for i := range bws {
			counts[i] = max(0, counts[i]-int64(r))
		}
	case Reset, Replace:
	default:
		binding = decide(d, req, logMeter{s, counts, bws, now})
		for i := range bws {
			counts[i] += d.Consumed // what take logged
		}
	}
	s.settleLog(d, &counts, bws, binding, longest, now)
}

// logCounts holds how many entries of the log each bandwidth's window
// holds, by index.
type logCounts [MaxBandwidths]int64

// logLimits returns the longest RefillPeriod of bws, in µs, and the bound
// on the log: the smallest Capacity among the bandwidths of that period.
// Each of those windows holds every entry the log keeps, so none can hold
// more than the bound.
func logLimits(bws []Bandwidth) (longest, bound int64) {
	for i := range bws {
		switch w, c := bws[i].PeriodMicros(), bws[i].Capacity; {
		case w > longest:
			longest, bound = w, c
		case w == longest:
			bound = min(bound, c)
		}
	}
	return longest, bound
}

// rebuildLog stamps s as built for cfg, leaving the log as it is.
func (s *State) rebuildLog(cfg *Config, fp uint64) {
	s.Bands = s.Bands[:0]
	for i := range cfg.Bandwidths {
		s.Bands = append(s.Bands, BandState{ID: cfg.Bandwidths[i].ID, Capacity: cfg.Bandwidths[i].Capacity})
	}
	s.Fingerprint, s.Algorithm = fp, SlidingWindowLog
}

// logAfter returns the index of the log's first entry after t: the count of
// entries at or before t.
func (s *State) logAfter(t int64) int {
	i, _ := slices.BinarySearch(s.Log, t+1)
	return i
}

// trimLog drops the entries at or before cutoff and then the oldest beyond
// bound, in place: the log's storage is reused, never reallocated.
func (s *State) trimLog(cutoff, bound int64) {
	drop := max(s.logAfter(cutoff), len(s.Log)-int(bound))
	if drop > 0 {
		s.Log = s.Log[:copy(s.Log, s.Log[drop:])]
	}
}

// countLog fills counts with how many entries each bandwidth's window
// holds at now.
func (s *State) countLog(counts *logCounts, bws []Bandwidth, now int64) {
	for i := range bws {
		counts[i] = int64(len(s.Log) - s.logAfter(now-bws[i].PeriodMicros()))
	}
}

// logMeter is a SlidingWindowLog bucket's state as decide asks of it:
// the log and how many of its entries each bandwidth's window holds.
type logMeter struct {
	s      *State
	counts logCounts // before any take
	bws    []Bandwidth
	now    int64
}

// wait returns the µs until every bandwidth can take n (at most its
// Capacity) if nothing is taken meanwhile, and the index of the bandwidth
// that takes longest. A bandwidth holding c entries lacks k = c + n −
// Capacity: it can take n once its k oldest entries have left its window,
// that is W after the k-th of them, the log's entry at len − c + k − 1.
func (m logMeter) wait(n int64) (wait int64, slowest int) {
	for i := range m.bws {
		if w := m.s.logWait(&m.bws[i], m.counts[i], n, m.now); w > wait {
			wait, slowest = w, i
		}
	}
	return wait, slowest
}

// logWait is the µs until a bandwidth b whose window holds c of the log's
// entries can take n, as logMeter.wait says.
func (s *State) logWait(b *Bandwidth, c, n, now int64) int64 {
	if c+n <= b.Capacity {
		return 0
	}
	kth := s.Log[int64(len(s.Log))+n-1-b.Capacity]
	return kth + b.PeriodMicros() - now
}

// room is the most tokens every bandwidth can still take: 0 if one is at
// or past its capacity.
func (m logMeter) room() int64 {
	room := int64(MaxLogCapacity)
	for i := range m.bws {
		room = min(room, m.bws[i].Capacity-m.counts[i])
	}
	return max(0, room)
}

// take logs n entries at now, after any entry at or before now; applyLog
// counts them in every window.
func (m logMeter) take(n int64) {
	s := m.s
	at, end := s.logAfter(m.now), len(s.Log)
	s.Log = slices.Grow(s.Log, int(n))[:end+int(n)]
	copy(s.Log[at+int(n):], s.Log[at:end])
	for i := at; i < at+int(n); i++ {
		s.Log[i] = m.now
	}
}

func (logMeter) lend(int64) bool { return false }

// settleLog completes d as settle does for a token bucket: the binding
// bandwidth (the one with the fewest requests left when binding is -1)
// and its RefillAfter, and ResetAfter, the time until every window is
// empty, which is the newest entry's time plus the longest period; and
// records when s expires.
func (s *State) settleLog(d *Decision, counts *logCounts, bws []Bandwidth, binding int, longest, now int64) {
	if binding < 0 {
		least := int64(MaxLogCapacity + 1)
		for i := range bws {
			if r := max(0, bws[i].Capacity-counts[i]); r < least {
				least, binding = r, i
			}
		}
	}
	d.Limit, d.Remaining, d.Bandwidth = bws[binding].Capacity, max(0, bws[binding].Capacity-counts[binding]), bandName(bws, binding)
	if d.Remaining < d.Limit {
		d.RefillAfter = micros(s.logWait(&bws[binding], counts[binding], d.Remaining+1, now))
	}
	s.ExpiresAt = now
	if len(s.Log) > 0 {
		s.ExpiresAt = s.Log[len(s.Log)-1] + longest
	}
	d.ResetAfter = micros(s.ExpiresAt - now)
}
