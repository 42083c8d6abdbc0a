package live_test

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/lm-warden/warden/live"
)

// Extract finds a request's session in the documented order: here Claude
// Code's older metadata.user_id form, since no session header is present.
func ExampleExtract() {
	body := `{"model":"qwen","metadata":{"user_id":"user_7f3a_account_0b1c_session_5d2e-41aa"},"messages":[]}`
	id, err := live.Extract(http.Header{}, []byte(body), live.APIAnthropic, 256)
	if err != nil {
		panic(err)
	}
	fmt.Println(id.Source, id.Session)
	// Output: metadata.user_id 5d2e-41aa
}

// ParseConfig names the file, the line and the key of a mistake.
func ExampleParseConfig() {
	_, err := live.ParseConfig("proxy.yaml", []byte(strings.Join([]string{
		"listen: :8080",
		"auth: passthrough",
		"models:",
		"  - name: qwen",
		"    url: http://10.0.0.10:8000",
		"    data_parallel_size: 4",
		"    spill_threshold: often",
	}, "\n")))
	fmt.Println(err)
	// Output: proxy.yaml:7: models[0].spill_threshold: want auto, priced or a positive integer, got "often"
}
