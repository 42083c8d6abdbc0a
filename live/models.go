package live

import (
	"bytes"
	"fmt"
	"net/http"
)

// serveModels answers GET /v1/models with the configured models, in
// Anthropic's shape when the client sent anthropic-version.
func (s *Server) serveModels(w http.ResponseWriter, r *http.Request, rt *routing) {
	var buf bytes.Buffer
	if r.Header.Get("anthropic-version") != "" {
		buf.WriteString(`{"data":[`)
		for i, name := range rt.names {
			if i > 0 {
				buf.WriteByte(',')
			}
			fmt.Fprintf(&buf, `{"type":"model","id":%s,"display_name":%s,"created_at":"1970-01-01T00:00:00Z"}`, jsonString(name), jsonString(name))
		}
		first, last := "null", "null"
		if len(rt.names) > 0 {
			first, last = jsonString(rt.names[0]), jsonString(rt.names[len(rt.names)-1])
		}
		fmt.Fprintf(&buf, `],"has_more":false,"first_id":%s,"last_id":%s}`, first, last)
	} else {
		buf.WriteString(`{"object":"list","data":[`)
		for i, name := range rt.names {
			if i > 0 {
				buf.WriteByte(',')
			}
			fmt.Fprintf(&buf, `{"id":%s,"object":"model","created":0,"owned_by":"warden"}`, jsonString(name))
		}
		buf.WriteString(`]}`)
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(buf.Bytes())
}
