package sim

import "time"

// Histogram counts durations in buckets of HistogramStep up to
// HistogramSpan, plus one overflow bucket, and keeps the exact maximum.
// Quantiles are reported as the upper edge of their bucket, capped at the
// maximum, so they are never below the true value and never above it by
// more than one step.
type Histogram struct {
	buckets []int64
	count   int64
	max     time.Duration
}

const (
	// HistogramStep is the resolution of convergence quantiles.
	HistogramStep = 100 * time.Millisecond
	// HistogramSpan is the largest duration with its own bucket.
	HistogramSpan = 2 * time.Hour
)

const histogramBuckets = int(HistogramSpan/HistogramStep) + 1

// Add counts one duration.
func (h *Histogram) Add(d time.Duration) {
	if h.buckets == nil {
		h.buckets = make([]int64, histogramBuckets)
	}
	i := int(d / HistogramStep)
	if d%HistogramStep != 0 {
		i++ // bucket i holds ((i-1)*step, i*step]
	}
	if i >= histogramBuckets {
		i = histogramBuckets - 1
	}
	h.buckets[i]++
	h.count++
	h.max = max(h.max, d)
}

// Merge adds every count of o.
func (h *Histogram) Merge(o *Histogram) {
	if o.count == 0 {
		return
	}
	if h.buckets == nil {
		h.buckets = make([]int64, histogramBuckets)
	}
	for i, c := range o.buckets {
		h.buckets[i] += c
	}
	h.count += o.count
	h.max = max(h.max, o.max)
}

// Count returns how many durations were added.
func (h *Histogram) Count() int64 { return h.count }

// Max returns the longest duration added (0 when none).
func (h *Histogram) Max() time.Duration { return h.max }

// Quantile returns the q-quantile (0 < q <= 1) as the upper edge of its
// bucket, capped at the maximum; 0 when empty.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.count == 0 {
		return 0
	}
	rank := int64(q*float64(h.count) + 0.999999999)
	rank = min(max(rank, 1), h.count)
	var seen int64
	for i, c := range h.buckets {
		seen += c
		if seen >= rank {
			if i == histogramBuckets-1 {
				return h.max
			}
			return min(time.Duration(i)*HistogramStep, h.max)
		}
	}
	return h.max
}
