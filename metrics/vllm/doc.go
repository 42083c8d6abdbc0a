// Package vllm reads a vLLM server's /metrics page: the one parser of it,
// for the proxy's scraper (live), the load client's measurements (bench)
// and scripts/llmdcompare.
//
// parse.go: Parse, which returns each engine's (data-parallel rank's)
// gauges and counters (Engine), the page read up to a cap its caller
// states, engine labels bounded (0 to 65,536) and looked up in a map so
// that a page of every one of them is read in linear time, and a
// max_num_seqs read from the *_config_info labels capped at
// MaxServerNumSeqs.
package vllm
