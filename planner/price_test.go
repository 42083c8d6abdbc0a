package planner

import (
	"slices"
	"strings"
	"testing"

	"github.com/lm-warden/warden/hardware"
)

// TestResolvePrices: one GPU kind and no price ranks by card count; kinds
// that mix, or any price given, rank by money, each kind at the price
// given, else the price list's, else an error naming the key.
func TestResolvePrices(t *testing.T) {
	list := func(gpu string) PriceUsed {
		lp, ok := hardware.LookupPrice(gpu)
		if !ok {
			t.Fatalf("no list price for %s", gpu)
		}
		return PriceUsed{GPU: lp.GPU, PerGPUHour: lp.USDPerGPUHour, From: PriceFromCatalogue, AsOf: lp.AsOf, Source: lp.Source}
	}
	farms := func(gpus ...string) []FarmSet {
		return []FarmSet{{GPUs: gpus, Replicas: []int{1}, Model: "Qwen/Qwen3-4B-Instruct-2507"}}
	}
	for _, tt := range []struct {
		name    string
		p       Plan
		want    []PriceUsed
		wantErr string
	}{
		{name: "one kind, no price: card count", p: Plan{Farms: farms("H100", "h100-sxm")}},
		{name: "kinds mix: the price list", p: Plan{Farms: farms("H100", "L40S")}, want: []PriceUsed{list("H100 SXM"), list("L40S")}},
		{name: "a price given overrides the list", p: Plan{Farms: farms("H100", "L40S"), Prices: map[string]float64{"l40s": 0.86}, PricesFrom: "--price"},
			want: []PriceUsed{list("H100 SXM"), {GPU: "L40S", PerGPUHour: 0.86, From: "--price"}}},
		{name: "one kind priced by the plan", p: Plan{Farms: farms("RTX A4000"), Prices: map[string]float64{"A4000": 0.25}},
			want: []PriceUsed{{GPU: "RTX A4000", PerGPUHour: 0.25, From: "the plan file"}}},
		{name: "one kind, a price for another: the list's", p: Plan{Farms: farms("L40S"), Prices: map[string]float64{"A4000": 0.25}},
			want: []PriceUsed{list("L40S")}},
		{name: "kinds mix, one not on the list", p: Plan{Farms: []FarmSet{farms("H100")[0], farms("RTX 4090", "RTX A4000")[0]}},
			wantErr: `farms[1].gpus[1]: RTX A4000 has no price: the candidates mix GPU kinds (H100 SXM, RTX 4090, RTX A4000)`},
		{name: "a price of a card not in the catalogue", p: Plan{Farms: farms("L40S"), Prices: map[string]float64{"Voodoo": 1}}, wantErr: "prices.Voodoo: unknown GPU"},
		{name: "a negative price", p: Plan{Farms: farms("L40S"), Prices: map[string]float64{"L40S": -1}}, wantErr: "prices.L40S: want a price >= 0"},
		{name: "priced twice", p: Plan{Farms: farms("L40S"), Prices: map[string]float64{"L40S": 1, "nvidia-l40s": 2}}, wantErr: "priced twice"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			prices, used, err := tt.p.resolvePrices()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(used, tt.want) {
				t.Errorf("prices used %+v\nwant %+v", used, tt.want)
			}
			for _, u := range used {
				if prices[u.GPU] != u.PerGPUHour {
					t.Errorf("price of %s = %g, want %g", u.GPU, prices[u.GPU], u.PerGPUHour)
				}
			}
			if len(tt.want) == 0 && prices != nil {
				t.Errorf("prices %v, want none (card count)", prices)
			}
		})
	}
}

func TestPricesWords(t *testing.T) {
	res := &Result{Prices: []PriceUsed{
		{GPU: "H100 SXM", PerGPUHour: 4.76, From: PriceFromCatalogue, AsOf: "2026-03-10", Source: "RunPod on-demand, x"},
		{GPU: "L40S", PerGPUHour: 0.86, From: "--price"},
	}}
	want := "Ranked by price per GPU-hour: H100 SXM 4.76 USD (warden's price list: RunPod on-demand, x, as of 2026-03-10) and L40S 0.86 (--price). " +
		`The price list's rates are one provider's on demand; give yours with --price "GPU=PER_GPU_HOUR,..." (or prices: in a plan file).`
	if got := res.PricesWords(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if got := (&Result{}).PricesWords(); got != "" {
		t.Errorf("by card count: %q, want none", got)
	}
}
