package planner

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/lm-warden/warden/hardware"
)

// PriceUsed is the price one GPU kind of a plan was ranked by, and where
// it came from: the run (--price, or prices: in the plan file) or the
// price list embedded in warden (hardware's catalog/prices.yaml), with its
// date and source.
type PriceUsed struct {
	GPU        string  `json:"gpu"`
	PerGPUHour float64 `json:"per_gpu_hour"`
	From       string  `json:"from"` // PriceFromCatalogue, "--price" or "the plan file"
	AsOf       string  `json:"as_of,omitempty"`
	Source     string  `json:"source,omitempty"`
}

// PriceFromCatalogue marks a price taken from the embedded price list.
const PriceFromCatalogue = "price list"

// resolvePrices gives every candidate GPU kind its hourly price, or none
// at all. A plan of one GPU kind without prices ranks by card count (the
// same order as by money). Otherwise it ranks by money: each kind takes
// the price the plan gives, else the price list's; a kind with neither is
// an error naming its key. A price must name a catalogue GPU, once, and be
// a finite number >= 0.
func (p Plan) resolvePrices() (map[string]float64, []PriceUsed, error) {
	given := map[string]float64{}   // canonical GPU name -> price
	givenKey := map[string]string{} // canonical GPU name -> key as written
	keys := slices.Sorted(maps.Keys(p.Prices))
	for _, k := range keys {
		g, err := hardware.LookupGPU(k)
		if err != nil {
			return nil, nil, bad("prices."+k, "%v", err)
		}
		if v := p.Prices[k]; !(v >= 0) || math.IsInf(v, 0) {
			return nil, nil, bad("prices."+k, "want a price >= 0 per GPU-hour, got %g", v)
		}
		if prev, dup := givenKey[g.Name]; dup {
			return nil, nil, bad("prices."+k, "%s is priced twice (also as %q)", g.Name, prev)
		}
		given[g.Name], givenKey[g.Name] = p.Prices[k], k
	}
	var kinds []gpuKind
	for i, f := range p.Farms {
		for j, name := range f.GPUs {
			g, err := hardware.LookupGPU(name)
			if err != nil {
				continue // FarmSet.check names it
			}
			if !slices.ContainsFunc(kinds, func(k gpuKind) bool { return k.name == g.Name }) {
				kinds = append(kinds, gpuKind{g.Name, fmt.Sprintf("farms[%d].gpus[%d]", i, j)})
			}
		}
	}
	if len(given) == 0 && len(kinds) <= 1 {
		return nil, nil, nil
	}
	from := cmp.Or(p.PricesFrom, "the plan file")
	prices := map[string]float64{}
	var used []PriceUsed
	for _, k := range kinds {
		if v, ok := given[k.name]; ok {
			prices[k.name] = v
			used = append(used, PriceUsed{GPU: k.name, PerGPUHour: v, From: from})
			continue
		}
		lp, ok := hardware.LookupPrice(k.name)
		if !ok {
			why := "the candidates mix GPU kinds (" + kindNames(kinds) + "), so they are ranked by price"
			if len(kinds) == 1 {
				why = "prices are given, so the candidates are ranked by price"
			}
			return nil, nil, bad(k.key, "%s has no price: %s, and warden's price list has none for it; give one (--price %q, or prices: in a plan file)",
				k.name, why, k.name+"=PER_GPU_HOUR")
		}
		prices[k.name] = lp.USDPerGPUHour
		used = append(used, PriceUsed{GPU: k.name, PerGPUHour: lp.USDPerGPUHour, From: PriceFromCatalogue, AsOf: lp.AsOf, Source: lp.Source})
	}
	return prices, used, nil
}

// gpuKind is one GPU kind of a plan and the key of its first appearance,
// farms[i].gpus[j].
type gpuKind struct{ name, key string }

func kindNames(ks []gpuKind) string {
	var names []string
	for _, k := range ks {
		names = append(names, k.name)
	}
	return strings.Join(names, ", ")
}

// PricesWords says which prices ranked the candidates, e.g. "prices per
// GPU-hour: H100 SXM 4.76 and L40S 1.40 USD (warden's price list: RunPod
// on-demand, ..., as of 2026-03-10; --price overrides)"; "" when the plan
// ranked by card count.
func (res *Result) PricesWords() string {
	if len(res.Prices) == 0 {
		return ""
	}
	var items, sources []string
	for _, u := range res.Prices {
		item := u.GPU + " " + strconv.FormatFloat(u.PerGPUHour, 'f', 2, 64)
		src := u.From
		if u.From == PriceFromCatalogue {
			item += " USD"
			src = "warden's price list: " + u.Source + ", as of " + u.AsOf
		}
		items = append(items, item+" ("+src+")")
		if !slices.Contains(sources, src) {
			sources = append(sources, src)
		}
	}
	s := "Ranked by price per GPU-hour: " + joinAnd(items) + "."
	for _, u := range res.Prices {
		if u.From == PriceFromCatalogue {
			s += ` The price list's rates are one provider's on demand; give yours with --price "GPU=PER_GPU_HOUR,..." (or prices: in a plan file).`
			break
		}
	}
	return s
}
