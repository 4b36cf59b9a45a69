// Package decay computes the weights of exponentially weighted moving
// averages cheaply. It is internal to inferlb.
package decay

// Weight approximates exp(-x) for x >= 0 as (1 - x/32)^32, five
// multiplications instead of math.Exp's range reduction and polynomial: it
// is the weight an EWMA gives its old value after x time constants. It is
// exact at 0, strictly decreasing to 0 at x = 32, and within 2% of exp(-x)
// relative to 1 (the error that matters for a weight) everywhere; e.g.
// 0.3621 at x = 1 against 0.3679. Negative x reads as 0.
func Weight(x float64) float64 {
	if !(x > 0) {
		return 1
	}
	y := 1 - x/32
	if y <= 0 {
		return 0
	}
	y *= y // ^2
	y *= y // ^4
	y *= y // ^8
	y *= y // ^16
	y *= y // ^32
	return y
}
