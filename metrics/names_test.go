package metrics

import (
	"testing"

	"github.com/prometheus/prometheus/model/labels"

	"github.com/lm-warden/warden/metrics/names"
)

// names spells out two of Prometheus's own label names (it may not import
// Prometheus): they must stay Prometheus's.
func TestNamesMatchPrometheus(t *testing.T) {
	if names.LabelName != labels.MetricName || names.LabelLE != labels.BucketLabel {
		t.Errorf("names.LabelName %q, names.LabelLE %q; Prometheus's are %q, %q", names.LabelName, names.LabelLE, labels.MetricName, labels.BucketLabel)
	}
}
