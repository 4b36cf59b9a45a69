package scoring_test

import (
	"fmt"

	"github.com/inferlb/inferlb/scoring"
)

// The curve behind the LLM scorer's KV-cache, GPU memory and utilization
// factors, for tuning its knees and steepness: 1 up to the knee, then
// rising hyperbolically towards a full cache. The defaults for the KV
// cache (KVKnee 0.85, Steepness 4; MaxKVPressure then caps the factor at
// 10) beside a later knee and a gentler slope.
func ExamplePressure() {
	fmt.Println("usage  default  knee 0.9  steepness 2")
	for _, u := range []float64{0.80, 0.90, 0.95, 0.99} {
		fmt.Printf("%4.0f%%  %6.1fx  %7.1fx  %10.1fx\n", 100*u,
			scoring.Pressure(u, 0.85, 4), scoring.Pressure(u, 0.9, 4), scoring.Pressure(u, 0.85, 2))
	}
	// Output:
	// usage  default  knee 0.9  steepness 2
	//   80%     1.0x      1.0x         1.0x
	//   90%     3.0x      1.0x         2.0x
	//   95%     9.0x      5.0x         5.0x
	//   99%    57.0x     37.0x        29.0x
}
