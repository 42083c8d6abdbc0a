package web

import (
	"bytes"
	_ "embed"
	"net/http"
	"time"
)

// EChartsVersion is the version of the Apache ECharts library embedded in the binary.
const EChartsVersion = "5.6.0"

// echartsJS is Apache ECharts 5.6.0 (echarts.min.js from the npm package), Apache-2.0;
// its LICENSE and NOTICE lie beside it in assets/echarts.
//
//go:embed assets/echarts/echarts.min.js
var echartsJS []byte

//go:embed assets/echarts/LICENSE
var echartsLicense []byte

//go:embed assets/echarts/NOTICE
var echartsNotice []byte

// StaticPath is the URL path under which StaticHandler serves the embedded echarts library.
const StaticPath = "/static/echarts.min.js"

// StaticHandler serves the embedded echarts library, its LICENSE and NOTICE:
//
//	/static/echarts.min.js
//	/static/echarts.LICENSE
//	/static/echarts.NOTICE
//
// Mount it at "/static/" of the same mux as the dashboard; nothing is ever fetched from a CDN.
func StaticHandler() http.Handler {
	files := map[string]struct {
		body  []byte
		ctype string
	}{
		"/static/echarts.min.js":  {echartsJS, "text/javascript; charset=utf-8"},
		"/static/echarts.LICENSE": {echartsLicense, "text/plain; charset=utf-8"},
		"/static/echarts.NOTICE":  {echartsNotice, "text/plain; charset=utf-8"},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, ok := files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", f.ctype)
		w.Header().Set("Cache-Control", "public, max-age=86400")
		// A zero modtime disables If-Modified-Since; ServeContent still answers ranges and HEAD.
		http.ServeContent(w, r, r.URL.Path, time.Time{}, bytes.NewReader(f.body))
	})
}
