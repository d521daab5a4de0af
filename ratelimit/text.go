package ratelimit

import "fmt"

// MarshalText returns the algorithm's name, as [Algorithm.String] gives it
// ("TokenBucket", "GCRA", ...). An unknown algorithm is an error wrapping
// [ErrInvalidConfig]: its String form would not parse back.
func (a Algorithm) MarshalText() ([]byte, error) {
	if a >= numAlgorithms {
		return nil, fmt.Errorf("%w: Algorithm %d is not a known Algorithm", ErrInvalidConfig, uint8(a))
	}
	return []byte(algorithmNames[a]), nil
}

// UnmarshalText sets a to the algorithm named text, as [Algorithm.String]
// spells it; names are case-sensitive. An unknown name is an error
// wrapping [ErrInvalidConfig] that quotes it, and leaves a unchanged.
func (a *Algorithm) UnmarshalText(text []byte) error {
	for i, name := range algorithmNames {
		if string(text) == name {
			*a = Algorithm(i)
			return nil
		}
	}
	return fmt.Errorf("%w: Algorithm %q is not a known Algorithm (TokenBucket, GCRA, FixedWindow, SlidingWindowLog, SlidingWindowCounter, LeakyBucket)", ErrInvalidConfig, text)
}

// refillKinds lists every RefillKind, in order.
var refillKinds = [...]RefillKind{Greedy, Interval, IntervalAligned}

// MarshalText returns the kind's name, as [RefillKind.String] gives it
// ("Greedy", "Interval", "IntervalAligned"). An unknown kind is an error
// wrapping [ErrInvalidConfig].
func (k RefillKind) MarshalText() ([]byte, error) {
	if int(k) >= len(refillKinds) {
		return nil, fmt.Errorf("%w: RefillKind %d is not a known RefillKind", ErrInvalidConfig, uint8(k))
	}
	return []byte(k.String()), nil
}

// UnmarshalText sets k to the kind named text, as [RefillKind.String]
// spells it; names are case-sensitive. An unknown name is an error
// wrapping [ErrInvalidConfig] that quotes it, and leaves k unchanged.
func (k *RefillKind) UnmarshalText(text []byte) error {
	for _, kind := range refillKinds {
		if string(text) == kind.String() {
			*k = kind
			return nil
		}
	}
	return fmt.Errorf("%w: RefillKind %q is not a known RefillKind (Greedy, Interval, IntervalAligned)", ErrInvalidConfig, text)
}
