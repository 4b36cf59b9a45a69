package balancer_test

// wideInt returns v as an int and true where an int holds it (64-bit
// platforms), and false where it does not: a test case for a count past
// 2^31-1 exists only where an int can carry one. v is a variable, not a
// constant, so the conversion compiles for 32-bit platforms too.
func wideInt(v int64) (int, bool) {
	return int(v), int64(int(v)) == v
}
