package plans

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/ratelimit"
)

// ParseBandwidths reads a plan's bandwidths from their stored JSON form
// (see the package documentation). It is strict: unknown or repeated
// fields, values of the wrong type, numbers that are not integers in the
// int64 range, missing required fields, more than
// [ratelimit.MaxBandwidths] entries and data after the array are errors
// wrapping [ErrInvalidPlan] that name the entry and the field, as in
//
//	plans: invalid plan: bandwidths[1].refill_period: time: invalid duration "soon"
//
// It checks the form only; [Plan.Validate] checks the values.
func ParseBandwidths(data []byte) ([]ratelimit.Bandwidth, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, syntaxError("bandwidths", dec, err)
	}
	if tok != json.Delim('[') {
		return nil, badJSON("bandwidths", "must be a JSON array, got %s", describe(tok))
	}
	bws := make([]ratelimit.Bandwidth, 0, 1)
	for i := 0; dec.More(); i++ {
		if i == ratelimit.MaxBandwidths {
			return nil, badJSON("bandwidths", "must have at most %d entries", ratelimit.MaxBandwidths)
		}
		b, err := parseBandwidth(dec, fmt.Sprintf("bandwidths[%d]", i))
		if err != nil {
			return nil, err
		}
		bws = append(bws, b)
	}
	if _, err := dec.Token(); err != nil { // the closing ']'
		return nil, syntaxError("bandwidths", dec, err)
	}
	if tok, err := dec.Token(); err != io.EOF {
		if err != nil {
			return nil, syntaxError("bandwidths", dec, err)
		}
		return nil, badJSON("bandwidths", "unexpected data after the array: %s", describe(tok))
	}
	return bws, nil
}

// bandwidthField is a field of a bandwidth's JSON object.
type bandwidthField uint8

const (
	fieldID bandwidthField = iota
	fieldCapacity
	fieldRefillTokens
	fieldRefillPeriod
	fieldRefill
	fieldInitialTokens
	fieldAlignedStart
	numFields
)

var fieldNames = [numFields]string{"id", "capacity", "refill_tokens", "refill_period", "refill", "initial_tokens", "aligned_start"}

// required are the fields every bandwidth object must have.
var required = [...]bandwidthField{fieldCapacity, fieldRefillTokens, fieldRefillPeriod}

func lookupField(name string) (bandwidthField, bool) {
	for f, n := range fieldNames {
		if n == name {
			return bandwidthField(f), true
		}
	}
	return 0, false
}

// parseBandwidth reads one bandwidth object; path names it in errors.
func parseBandwidth(dec *json.Decoder, path string) (ratelimit.Bandwidth, error) {
	var b ratelimit.Bandwidth
	tok, err := dec.Token()
	if err != nil {
		return b, syntaxError(path, dec, err)
	}
	if tok != json.Delim('{') {
		return b, badJSON(path, "must be an object, got %s", describe(tok))
	}
	var seen [numFields]bool
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return b, syntaxError(path, dec, err)
		}
		name, _ := tok.(string) // inside an object, Token returns keys as strings
		f, ok := lookupField(name)
		if !ok {
			return b, badJSON(path, "unknown field %q", name)
		}
		fpath := path + "." + name
		if seen[f] {
			return b, badJSON(fpath, "repeated")
		}
		seen[f] = true
		value, err := dec.Token()
		if err != nil {
			return b, syntaxError(fpath, dec, err)
		}
		if err := setField(&b, f, value); err != nil {
			return b, &planError{reason: fpath + ": " + err.Error(), cause: errors.Unwrap(err)}
		}
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return b, syntaxError(path, dec, err)
	}
	for _, f := range required {
		if !seen[f] {
			return b, badJSON(path+"."+fieldNames[f], "missing")
		}
	}
	return b, nil
}

// setField sets field f of b from its JSON value. The optional fields take
// null as absent. A value that is an object or an array is rejected before
// the decoder reads into it, so parsing stops there.
func setField(b *ratelimit.Bandwidth, f bandwidthField, value json.Token) error {
	if value == nil && f != fieldCapacity && f != fieldRefillTokens && f != fieldRefillPeriod {
		return nil
	}
	var err error
	switch f {
	case fieldID:
		b.ID, err = stringValue(value)
	case fieldCapacity:
		b.Capacity, err = intValue(value)
	case fieldRefillTokens:
		b.RefillTokens, err = intValue(value)
	case fieldRefillPeriod:
		b.RefillPeriod, err = durationValue(value)
	case fieldRefill:
		var s string
		if s, err = stringValue(value); err == nil {
			if uerr := b.Refill.UnmarshalText([]byte(s)); uerr != nil {
				err = reasonError{configReason(uerr), uerr}
			}
		}
	case fieldInitialTokens:
		var n int64
		if n, err = intValue(value); err == nil {
			b.InitialTokens = &n
		}
	case fieldAlignedStart:
		var s string
		if s, err = stringValue(value); err == nil {
			if terr := b.AlignedStart.UnmarshalText([]byte(s)); terr != nil {
				err = reasonError{terr.Error(), terr}
			}
		}
	}
	return err
}

// reasonError is a field's error message, with the error behind it.
type reasonError struct {
	msg   string
	cause error
}

func (e reasonError) Error() string { return e.msg }
func (e reasonError) Unwrap() error { return e.cause }

func stringValue(v json.Token) (string, error) {
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("must be a string, got %s", describe(v))
	}
	return s, nil
}

func intValue(v json.Token) (int64, error) {
	num, ok := v.(json.Number)
	if !ok {
		return 0, fmt.Errorf("must be an integer, got %s", describe(v))
	}
	n, err := strconv.ParseInt(string(num), 10, 64)
	if errors.Is(err, strconv.ErrRange) {
		return 0, fmt.Errorf("must be in the int64 range, got %s", num)
	}
	if err != nil {
		return 0, fmt.Errorf("must be an integer, got %s", num)
	}
	return n, nil
}

func durationValue(v json.Token) (time.Duration, error) {
	s, ok := v.(string)
	if !ok {
		return 0, fmt.Errorf(`must be a duration string such as "1m", got %s`, describe(v))
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, reasonError{err.Error(), err}
	}
	return d, nil
}

// describe names a JSON token's kind for an error message.
func describe(tok json.Token) string {
	switch v := tok.(type) {
	case nil:
		return "null"
	case bool:
		return strconv.FormatBool(v)
	case json.Number:
		return "number " + string(v)
	case string:
		return "string " + strconv.Quote(v)
	case json.Delim:
		if v == '{' {
			return "an object"
		}
		if v == '[' {
			return "an array"
		}
	}
	return fmt.Sprintf("%v", tok)
}

func badJSON(path, format string, args ...any) error {
	return &planError{reason: path + ": " + fmt.Sprintf(format, args...)}
}

// syntaxError reports a decoder error (bad JSON, or data that ends early)
// at path, with where in the data it was found.
func syntaxError(path string, dec *json.Decoder, err error) error {
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return &planError{reason: fmt.Sprintf("%s: invalid JSON at offset %d: %v", path, dec.InputOffset(), err), cause: err}
}

// bandwidthJSON is the stored form of one bandwidth, for MarshalBandwidths.
type bandwidthJSON struct {
	ID            string `json:"id,omitempty"`
	Capacity      int64  `json:"capacity"`
	RefillTokens  int64  `json:"refill_tokens"`
	RefillPeriod  string `json:"refill_period"`
	Refill        string `json:"refill"`
	InitialTokens *int64 `json:"initial_tokens,omitempty"`
	AlignedStart  string `json:"aligned_start,omitempty"`
}

// MarshalBandwidths returns bws in the stored JSON form that
// [ParseBandwidths] reads: refill always, id, initial_tokens and
// aligned_start only when set. A RefillKind that is not known or an
// AlignedStart outside the years 0 to 9999 is an error wrapping
// [ErrInvalidPlan] that names the entry and field; other values are
// written as they are, for [Plan.Validate] to judge.
func MarshalBandwidths(bws []ratelimit.Bandwidth) ([]byte, error) {
	out := make([]bandwidthJSON, len(bws))
	for i, b := range bws {
		refill, err := b.Refill.MarshalText()
		if err != nil {
			return nil, &planError{reason: fmt.Sprintf("bandwidths[%d].refill: %s", i, configReason(err)), cause: err}
		}
		out[i] = bandwidthJSON{
			ID:            b.ID,
			Capacity:      b.Capacity,
			RefillTokens:  b.RefillTokens,
			RefillPeriod:  b.RefillPeriod.String(),
			Refill:        string(refill),
			InitialTokens: b.InitialTokens,
		}
		if !b.AlignedStart.IsZero() {
			start, err := b.AlignedStart.MarshalText()
			if err != nil {
				return nil, &planError{reason: fmt.Sprintf("bandwidths[%d].aligned_start: %v", i, err), cause: err}
			}
			out[i].AlignedStart = string(start)
		}
	}
	return json.Marshal(out)
}
