package scoring

import (
	"errors"
	"fmt"
	"math"
)

// Validate reports the first field of l that cannot be meant: NaN or
// negative values, knees outside [0, 1], a MaxKVPressure below 1, a
// LoRALoad or LoRAWait below 1 or infinite. Zero fields take their
// defaults. The balancer calls it for the Scorers it is
// given, so a mistyped setting fails at construction instead of quietly
// becoming a default (a negative value did) or turning a curve upside
// down (with a MaxKVPressure of 0.5 an endpoint reporting a full KV cache
// cost less than one reporting nothing, and as little as an idle one).
// A nil l is refused too: it is not a nil Scorer, and Cost would
// dereference it.
func (l *LLM) Validate() error {
	if l == nil {
		return isNil("LLM")
	}
	for _, f := range []struct {
		name string
		v    float64
	}{
		{"QueueWeight", l.QueueWeight}, {"TokenUnit", l.TokenUnit}, {"ErrorPenalty", l.ErrorPenalty},
		{"MemorySteepness", l.MemorySteepness}, {"Steepness", l.Steepness},
	} {
		if err := nonNegative("LLM", f.name, f.v); err != nil {
			return err
		}
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"KVKnee", l.KVKnee}, {"MemoryKnee", l.MemoryKnee}, {"UtilKnee", l.UtilKnee}} {
		if !(f.v >= 0 && f.v <= 1) {
			return invalid("LLM", f.name, f.v, "must be in [0, 1] (0 means the default, 1 turns its factor off)")
		}
	}
	if l.MaxKVPressure != 0 && !(l.MaxKVPressure >= 1) {
		return invalid("LLM", "MaxKVPressure", l.MaxKVPressure, "must be at least 1 (0 means the default 10)")
	}
	for _, f := range []struct {
		name string
		v, d float64
	}{{"LoRALoad", l.LoRALoad, 1.5}, {"LoRAWait", l.LoRAWait, 16}} {
		if f.v != 0 && !(f.v >= 1 && f.v <= math.MaxFloat64) {
			return invalid("LLM", f.name, f.v, fmt.Sprintf("must be a finite factor of at least 1 (1 turns it off; 0 means the default %v)", f.d))
		}
	}
	return nil
}

// Validate reports a NaN or negative field of l, or a nil l; zero fields
// take their defaults.
func (l *Latency) Validate() error {
	if l == nil {
		return isNil("Latency")
	}
	if l.Prior < 0 {
		return invalid("Latency", "Prior", l.Prior, "must not be negative (0 means the default)")
	}
	return nonNegative("Latency", "ErrorPenalty", l.ErrorPenalty)
}

// Validate reports a NaN or negative ErrorPenalty, or a nil l; zero takes
// the default.
func (l *LeastLoaded) Validate() error {
	if l == nil {
		return isNil("LeastLoaded")
	}
	return nonNegative("LeastLoaded", "ErrorPenalty", l.ErrorPenalty)
}

// ErrInvalid is what every Validate error wraps.
var ErrInvalid = errors.New("invalid scorer setting")

func nonNegative(scorer, field string, v float64) error {
	if !(v >= 0) { // also true for NaN
		return invalid(scorer, field, v, "must not be negative or NaN (0 means the default)")
	}
	return nil
}

// isNil is the error for a nil *scorer: a typed nil in a Scorer interface
// passes a nil check on the interface, and its Cost would panic on the
// first pick.
func isNil(scorer string) error {
	return fmt.Errorf("inferlb: scoring.%s is nil: use &scoring.%s{} for the defaults: %w", scorer, scorer, ErrInvalid)
}

func invalid(scorer, field string, v any, rule string) error {
	return fmt.Errorf("inferlb: scoring.%s.%s = %v: %s: %w", scorer, field, v, rule, ErrInvalid)
}
