package ratelimit

func applyFixedWindow(s *State, cfg Config, req Request, now int64) Decision {
	panic("TODO")
}
