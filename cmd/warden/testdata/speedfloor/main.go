// Command speedfloor is the floor of TestSpeed: Go's own
// httputil.ReverseProxy with the proxy's transport settings, routing by
// the session header's hash, and nothing else (no body read, no parsing,
// no metrics). What warden costs beyond it is warden's; what it costs
// beyond HAProxy is Go's net/http.
//
//	speedfloor LISTEN BACKEND...
package main

import (
	"hash/fnv"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
)

func main() {
	if len(os.Args) < 3 {
		log.Fatal("usage: speedfloor LISTEN BACKEND...")
	}
	var targets []*url.URL
	for _, b := range os.Args[2:] {
		u, err := url.Parse(b)
		if err != nil {
			log.Fatal(err)
		}
		targets = append(targets, u)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost = 1024, 256
	rp := &httputil.ReverseProxy{Transport: tr, FlushInterval: -1, Rewrite: func(pr *httputil.ProxyRequest) {
		h := fnv.New32a()
		_, _ = h.Write([]byte(pr.In.Header.Get("X-Claude-Code-Session-Id")))
		pr.SetURL(targets[h.Sum32()%uint32(len(targets))])
	}}
	log.Fatal(http.ListenAndServe(os.Args[1], rp))
}
