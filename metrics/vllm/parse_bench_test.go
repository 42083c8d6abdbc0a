package vllm

import (
	"bytes"
	"strconv"
	"testing"
)

// manyEnginesPage is a /metrics page with n engine labels on two series,
// under MaxPageBytes for n = 64k: what a replica that is not vLLM, or
// a broken one, can serve.
func manyEnginesPage(n int) []byte {
	var b bytes.Buffer
	for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting"} {
		b.WriteString("# TYPE " + name + " gauge\n")
		for e := range n {
			b.WriteString(name + `{engine="` + strconv.Itoa(e) + `"} 1` + "\n")
		}
	}
	return b.Bytes()
}

// BenchmarkParse64kEngines parses a page of 65,536 engines (issue
// 35 item 6: each engine used to be looked up by a linear search, 21 s of
// CPU a scrape at this size).
//
//	go test -run '^$' -bench Parse64k -benchtime 3x ./metrics/vllm/
func BenchmarkParse64kEngines(b *testing.B) {
	page := manyEnginesPage(1 << 16)
	if len(page) > MaxPageBytes {
		b.Fatalf("page of %d bytes is over the %d-byte cap", len(page), MaxPageBytes)
	}
	b.SetBytes(int64(len(page)))
	b.ReportAllocs()
	for b.Loop() {
		got, err := Parse(bytes.NewReader(page), MaxPageBytes)
		if err != nil || len(got) != 1<<16 {
			b.Fatalf("%d engines, err %v", len(got), err)
		}
	}
}
