package httpbalancer

// CallBufSizes are the peek buffers that share the call state's allocation.
var CallBufSizes = []int{len(callBuf1K{}.buf), len(callBuf2K{}.buf), len(callBuf4K{}.buf), len(callBuf8K{}.buf)}
