package lease

// WaitRefills waits for the refills in flight: a test that drives one
// goroutine makes each call's refill land before the next call.
func (b *Backend) WaitRefills() { b.refills.Wait() }

// Decay is decay, for the fuzz target.
var Decay = decay
