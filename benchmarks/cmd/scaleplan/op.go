package main

import (
	"fmt"
	"strconv"
	"strings"
)

// op is the decision net makes, from -op.
type op struct {
	name string // as given, for the output
	// upTo is ConsumeUpTo's max, every token of which must be granted; 0
	// for a Consume of one token.
	upTo int64
	// anyOutcome lets a Consume be denied; denials are counted.
	anyOutcome bool
}

// parseOp parses -op: consume, any or upto:K.
func parseOp(s string) (op, error) {
	switch s {
	case "consume":
		return op{name: s}, nil
	case "any":
		return op{name: s, anyOutcome: true}, nil
	}
	if k, ok := strings.CutPrefix(s, "upto:"); ok {
		n, err := strconv.ParseInt(k, 10, 64)
		if err == nil && n > 0 {
			return op{name: s, upTo: n}, nil
		}
	}
	return op{}, fmt.Errorf("-op %q: want consume, any or upto:K with K > 0", s)
}
