package main

import (
	"math"
	"slices"
	"time"
)

// Summary describes a sample of durations in milliseconds.
type Summary struct {
	N      int     `json:"n"`
	Median float64 `json:"median_ms"`
	P90    float64 `json:"p90_ms"`
	Min    float64 `json:"min_ms"`
	Max    float64 `json:"max_ms"`
	Mean   float64 `json:"mean_ms"`
}

// summarize computes the summary of samples (ms). Quantiles interpolate
// linearly between order statistics (R's type 7, numpy's default), so the
// p90 of 10 samples lies between the 9th and 10th smallest.
func summarize(samples []float64) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	var sum float64
	for _, v := range s {
		sum += v
	}
	return Summary{
		N: len(s), Median: quantile(s, 0.5), P90: quantile(s, 0.9),
		Min: s[0], Max: s[len(s)-1], Mean: sum / float64(len(s)),
	}
}

// quantile of sorted s, q in [0,1].
func quantile(s []float64, q float64) float64 {
	if len(s) == 0 {
		return math.NaN()
	}
	h := q * float64(len(s)-1)
	lo := math.Floor(h)
	i := int(lo)
	if i+1 >= len(s) {
		return s[len(s)-1]
	}
	return s[i] + (h-lo)*(s[i+1]-s[i])
}

// ms converts a duration to milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
