package live

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// TestExampleConfigsShowEveryKey: the example configurations, the
// reference operators copy from (testdata/proxy.yaml says "every key is
// shown"), name every key the loader reads; proxy-shared.yaml holds the
// session store's. A key added to Config without its line in an example
// fails here.
func TestExampleConfigsShowEveryKey(t *testing.T) {
	var text strings.Builder
	for _, f := range []string{"testdata/proxy.yaml", "testdata/proxy-shared.yaml"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text.Write(b)
	}
	for _, key := range yamlKeys(reflect.TypeFor[Config](), "") {
		name := key[strings.LastIndex(key, ".")+1:]
		if !regexp.MustCompile(`(?m)^[\s-]*` + regexp.QuoteMeta(name) + `:`).MatchString(text.String()) {
			t.Errorf("%s: no example configuration shows it", key)
		}
	}
}

// yamlKeys returns the dotted yaml keys of struct type t and of the
// structs (and slices of structs) it holds.
func yamlKeys(t reflect.Type, prefix string) []string {
	var keys []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		keys = append(keys, prefix+name)
		ft := f.Type
		if ft.Kind() == reflect.Slice {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct && ft.PkgPath() == t.PkgPath() && hasYAMLFields(ft) {
			keys = append(keys, yamlKeys(ft, prefix+name+".")...)
		}
	}
	return keys
}

func hasYAMLFields(t reflect.Type) bool {
	for f := range t.Fields() {
		if f.Tag.Get("yaml") != "" {
			return true
		}
	}
	return false
}
