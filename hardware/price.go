package hardware

import (
	_ "embed"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Price is a GPU's hourly rental price from the embedded price list
// (catalog/prices.yaml): what a plan ranks GPU kinds by when they mix and
// no price is given for the run.
type Price struct {
	GPU           string  `json:"gpu"` // catalogue name
	USDPerGPUHour float64 `json:"usd_per_gpu_hour"`
	AsOf          string  `json:"as_of"` // YYYY-MM-DD: when the source listed it
	Source        string  `json:"source"`
}

// priceEntry is one price as written in catalog/prices.yaml.
type priceEntry struct {
	GPU           string  `yaml:"gpu"`
	USDPerGPUHour float64 `yaml:"usd_per_gpu_hour"`
	AsOf          string  `yaml:"as_of"`
	Source        string  `yaml:"source"`
}

//go:embed catalog/prices.yaml
var pricesYAML []byte

var (
	pricesOnce sync.Once
	thePrices  []Price // sorted by GPU name
)

func loadedPrices() []Price {
	pricesOnce.Do(func() {
		ps, err := parsePrices(pricesYAML)
		if err != nil {
			panic("hardware: embedded price list: " + err.Error())
		}
		thePrices = ps
	})
	return thePrices
}

// parsePrices reads a price list: every entry names a catalogue GPU once,
// with a finite price > 0, a date and a source.
func parsePrices(data []byte) ([]Price, error) {
	const file = "catalog/prices.yaml"
	var es []priceEntry
	if err := decodeStrict(file, data, &es); err != nil {
		return nil, err
	}
	var out []Price
	for i, e := range es {
		g, err := LookupGPU(e.GPU)
		switch {
		case err != nil:
			return nil, fmt.Errorf("%s: entry %d: gpu: %w", file, i+1, err)
		case !positive(e.USDPerGPUHour):
			return nil, fmt.Errorf("%s: entry %d (%s): usd_per_gpu_hour: want a price > 0, got %g", file, i+1, g.Name, e.USDPerGPUHour)
		case e.Source == "":
			return nil, fmt.Errorf("%s: entry %d (%s): source: missing (name the price list)", file, i+1, g.Name)
		}
		if _, err := time.Parse(time.DateOnly, e.AsOf); err != nil {
			return nil, fmt.Errorf("%s: entry %d (%s): as_of: want the date the source listed the price, YYYY-MM-DD, got %q", file, i+1, g.Name, e.AsOf)
		}
		if slices.ContainsFunc(out, func(p Price) bool { return p.GPU == g.Name }) {
			return nil, fmt.Errorf("%s: entry %d: %s is priced twice", file, i+1, g.Name)
		}
		out = append(out, Price{GPU: g.Name, USDPerGPUHour: e.USDPerGPUHour, AsOf: e.AsOf, Source: e.Source})
	}
	slices.SortFunc(out, func(a, b Price) int { return strings.Compare(a.GPU, b.GPU) })
	return out, nil
}

// Prices returns the embedded price list, sorted by GPU name. The slice is
// a copy.
func Prices() []Price { return slices.Clone(loadedPrices()) }

// LookupPrice returns the price list's price of a GPU (any name or alias
// LookupGPU takes), and false when the list has none.
func LookupPrice(gpu string) (Price, bool) {
	g, err := LookupGPU(gpu)
	if err != nil {
		return Price{}, false
	}
	for _, p := range loadedPrices() {
		if p.GPU == g.Name {
			return p, true
		}
	}
	return Price{}, false
}
