package httpbalancer

// CallBufSizes are the peek buffers that share the call state's allocation.
var CallBufSizes = []int{len(callBuf896{}.buf), len(callBuf1280{}.buf), len(callBuf2048{}.buf), len(callBuf4096{}.buf), len(callBuf8192{}.buf)}

// ServerClosedIdle is serverClosedIdle, for a test with net/http's own error.
var ServerClosedIdle = serverClosedIdle

// NamesMissingModel is namesMissingModel, for its table test.
var NamesMissingModel = namesMissingModel
