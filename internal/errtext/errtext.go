// Package errtext rewords errors without losing them: the adapters name a
// field as their caller wrote it, or drop a prefix an error repeats, while
// errors.Is and errors.As still find the error underneath.
package errtext

// Reworded returns an error whose message is msg and which unwraps to err.
func Reworded(err error, msg string) error { return reworded{err, msg} }

type reworded struct {
	err error
	msg string
}

func (r reworded) Error() string { return r.msg }
func (r reworded) Unwrap() error { return r.err }
