package modelserver

import (
	"github.com/inferlb/inferlb/telemetry"
	"github.com/inferlb/inferlb/telemetry/loadheader"
)

// LoadHeader is the response header in which vLLM (and other ORCA-over-HTTP
// servers) report their load; see package loadheader, which reads it
// without this package's metrics-parser dependencies.
const LoadHeader = loadheader.Name

// LoadFormatHeader is the request header that asks the server for a load
// report and names its format ("text" or "json").
const LoadFormatHeader = loadheader.FormatName

// ErrLoadFormat is returned for a load header in a format that is not read.
var ErrLoadFormat = loadheader.ErrFormat

// ParseLoadHeader is loadheader.Parse, kept here for callers that already
// import this package for its scrapes.
func ParseLoadHeader(value string) (telemetry.Sample, error) {
	return loadheader.Parse(value)
}
