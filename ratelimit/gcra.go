package ratelimit

func applyGCRA(s *State, cfg Config, req Request, now int64) Decision {
	panic("TODO")
}
