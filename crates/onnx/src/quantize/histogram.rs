//! Per-tensor statistics for calibration: the observed minimum and maximum, and a
//! 2048-bin histogram of `|x|` that grows (merging neighbouring bins) when a later sample
//! goes further than the ones before, so one pass over the calibration set suffices.
//!
//! [`TensorHistogram::range`] turns the statistics into the float range a tensor is
//! quantized over, by one of three methods: the observed extremes (min-max), a percentile
//! of `|x|`, or the threshold of least information loss (entropy, TensorRT's
//! `EntropyCalibration2`: minimum KL divergence between the clipped distribution and its
//! 128-level quantization).

/// Bins of the `|x|` histogram.
pub const BINS: usize = 2048;

/// Levels of one sign of an 8-bit code, as the entropy search quantizes to (TensorRT's).
const LEVELS: usize = 128;

/// How a tensor's calibration range is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CalibrationMethod {
    /// The extremes seen over the calibration set.
    MinMax,
    /// Clip `|x|` at this percentile (e.g. 99.99) of the values seen.
    Percentile(f64),
    /// Clip `|x|` where the KL divergence between the clipped distribution and its 8-bit
    /// quantization is least (TensorRT's entropy calibration).
    Entropy,
}

impl CalibrationMethod {
    /// A short name for metadata and reports: `min-max`, `percentile-99.99`, `entropy`.
    pub fn name(&self) -> String {
        match self {
            Self::MinMax => "min-max".into(),
            Self::Percentile(p) => format!("percentile-{p}"),
            Self::Entropy => "entropy".into(),
        }
    }
}

/// What calibration saw of one tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorHistogram {
    pub min: f32,
    pub max: f32,
    /// Upper edge of the last bin; `0` until a non-zero value was seen.
    pub amax: f32,
    /// [`BINS`] counts, or none when only the extremes are kept ([`Self::extremes_only`]).
    pub counts: Vec<u64>,
}

impl Default for TensorHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl TensorHistogram {
    pub fn new() -> Self {
        Self {
            min: f32::INFINITY,
            max: f32::NEG_INFINITY,
            amax: 0.0,
            counts: vec![0; BINS],
        }
    }

    /// Statistics for min-max calibration alone: the extremes, no bins. Binning was 42% of
    /// a calibration's time on 2 cores (a profile of 20 images, 2026-12-06), and min-max
    /// needs none of it.
    pub fn extremes_only() -> Self {
        Self {
            counts: Vec::new(),
            ..Self::new()
        }
    }

    /// The statistics `method` needs: bins for the clipping methods, extremes for min-max.
    pub fn for_method(method: CalibrationMethod) -> Self {
        match method {
            CalibrationMethod::MinMax => Self::extremes_only(),
            CalibrationMethod::Percentile(_) | CalibrationMethod::Entropy => Self::new(),
        }
    }

    /// Adds one sample's values (non-finite values are ignored).
    pub fn add(&mut self, values: &[f32]) {
        let (lo, hi) = extremes(values);
        if lo > hi {
            return;
        }
        self.min = self.min.min(lo);
        self.max = self.max.max(hi);
        if self.counts.is_empty() {
            return;
        }
        let top = lo.abs().max(hi.abs());
        if top == 0.0 {
            self.counts[0] += values.len() as u64;
            return;
        }
        if self.amax == 0.0 {
            // The first non-zero sample sets the scale; any zeros counted so far sit in bin 0.
            self.amax = top;
        }
        while top > self.amax {
            self.double_range();
        }
        let per_unit = BINS as f32 / self.amax;
        for &v in values.iter().filter(|v| v.is_finite()) {
            let bin = ((v.abs() * per_unit) as usize).min(BINS - 1);
            self.counts[bin] += 1;
        }
    }

    /// Doubles the covered range: bins `2i` and `2i+1` become bin `i`.
    fn double_range(&mut self) {
        for i in 0..BINS / 2 {
            self.counts[i] = self.counts[2 * i] + self.counts[2 * i + 1];
        }
        self.counts[BINS / 2..].iter_mut().for_each(|c| *c = 0);
        self.amax *= 2.0;
    }

    /// Whether any value was seen.
    pub fn is_empty(&self) -> bool {
        self.min > self.max
    }

    fn bin_width(&self) -> f32 {
        self.amax / BINS as f32
    }

    /// The range to quantize over: `(low, high)` with `low <= 0 <= high` (zero must be
    /// exactly representable). For a clipping method the observed extremes are clipped at
    /// the chosen `|x|` threshold on both sides.
    ///
    /// # Panics
    /// For a clipping method on statistics made by [`Self::extremes_only`].
    pub fn range(&self, method: CalibrationMethod) -> (f32, f32) {
        assert!(
            method == CalibrationMethod::MinMax || !self.counts.is_empty(),
            "{} needs the histogram's bins; these statistics kept only the extremes",
            method.name()
        );
        if self.is_empty() {
            return (0.0, 0.0);
        }
        let (min, max) = (self.min.min(0.0), self.max.max(0.0));
        let threshold = match method {
            CalibrationMethod::MinMax => return (min, max),
            CalibrationMethod::Percentile(p) => self.percentile_threshold(p),
            CalibrationMethod::Entropy => self.entropy_threshold(),
        };
        (min.max(-threshold), max.min(threshold))
    }

    fn percentile_threshold(&self, percentile: f64) -> f32 {
        let total: u64 = self.counts.iter().sum();
        let wanted = (total as f64 * percentile.clamp(0.0, 100.0) / 100.0).ceil() as u64;
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= wanted {
                return (i + 1) as f32 * self.bin_width();
            }
        }
        self.amax
    }

    /// TensorRT's `EntropyCalibration2` search: for every candidate clip bin `i` (128 to
    /// 2048), the reference distribution is `counts[..i]` with the clipped tail added to its
    /// last bin; the candidate is `counts[..i]` merged into 128 levels and spread back over
    /// the non-empty bins of each level. The `i` of least KL divergence wins; the
    /// threshold is that bin's upper edge.
    fn entropy_threshold(&self) -> f32 {
        let last_used = self.counts.iter().rposition(|&c| c > 0).unwrap_or(0) + 1;
        if last_used <= LEVELS {
            // Everything fits in 128 levels without clipping: nothing to gain.
            return last_used as f32 * self.bin_width();
        }
        let mut best = (f64::INFINITY, BINS);
        let mut reference = vec![0f64; BINS];
        let mut candidate = vec![0f64; BINS];
        let tail_sums: Vec<u64> = {
            let mut sums = vec![0u64; BINS + 1];
            for i in (0..BINS).rev() {
                sums[i] = sums[i + 1] + self.counts[i];
            }
            sums
        };
        for i in LEVELS..=last_used {
            for (r, &c) in reference[..i].iter_mut().zip(&self.counts[..i]) {
                *r = c as f64;
            }
            reference[i - 1] += tail_sums[i] as f64;
            quantize_into(&self.counts[..i], &mut candidate[..i]);
            let kl = kl_divergence(&reference[..i], &candidate[..i]);
            if kl < best.0 {
                best = (kl, i);
            }
        }
        best.1 as f32 * self.bin_width()
    }
}

/// The finite extremes of `values` (`(inf, -inf)` when there are none). Eight running
/// lanes so that the compiler vectorises the common case; `f32::min`/`max` skip NaN, and
/// an infinite extreme sends the slice through the filtering loop.
fn extremes(values: &[f32]) -> (f32, f32) {
    let (mut lo, mut hi) = ([f32::INFINITY; 8], [f32::NEG_INFINITY; 8]);
    let chunks = values.chunks_exact(8);
    let rest = chunks.remainder();
    for chunk in chunks {
        for i in 0..8 {
            lo[i] = lo[i].min(chunk[i]);
            hi[i] = hi[i].max(chunk[i]);
        }
    }
    let fold = |a: [f32; 8], f: fn(f32, f32) -> f32, start: f32| {
        a.into_iter().chain(rest.iter().copied()).fold(start, f)
    };
    let (low, high) = (
        fold(lo, f32::min, f32::INFINITY),
        fold(hi, f32::max, f32::NEG_INFINITY),
    );
    if low.is_finite() && high.is_finite() {
        return (low, high);
    }
    values
        .iter()
        .filter(|v| v.is_finite())
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(l, h), &v| {
            (l.min(v), h.max(v))
        })
}

/// `counts` merged into [`LEVELS`] equal groups of bins, each group's total spread evenly
/// over its non-empty bins (empty bins stay empty), written into `out`.
fn quantize_into(counts: &[u64], out: &mut [f64]) {
    let n = counts.len();
    for level in 0..LEVELS {
        let start = level * n / LEVELS;
        let end = ((level + 1) * n / LEVELS).max(start + 1).min(n);
        let group = &counts[start..end];
        let total: u64 = group.iter().sum();
        let nonzero = group.iter().filter(|&&c| c > 0).count();
        for (o, &c) in out[start..end].iter_mut().zip(group) {
            *o = if c > 0 { total as f64 / nonzero as f64 } else { 0.0 };
        }
    }
}

/// KL(p || q) of two unnormalised distributions over the same bins. Bins where `p` is
/// zero contribute nothing; where `q` is zero but `p` is not (the clipped tail landing in
/// an empty bin), `q` is smoothed to a small share, as TensorRT and MXNet do.
fn kl_divergence(p: &[f64], q: &[f64]) -> f64 {
    const EPS: f64 = 1e-4;
    let p_sum: f64 = p.iter().sum();
    let q_sum: f64 = q.iter().sum();
    if p_sum == 0.0 || q_sum == 0.0 {
        return f64::INFINITY;
    }
    let q_zeros = q.iter().filter(|&&v| v == 0.0).count() as f64;
    let q_nonzeros = q.len() as f64 - q_zeros;
    // Take EPS of mass from the non-empty bins, shared over the empty ones.
    let take = if q_nonzeros > 0.0 {
        EPS * q_zeros / q_nonzeros
    } else {
        0.0
    };
    let mut kl = 0.0;
    for (&pv, &qv) in p.iter().zip(q) {
        if pv == 0.0 {
            continue;
        }
        let pn = pv / p_sum;
        let qn = if qv == 0.0 {
            EPS
        } else {
            qv / q_sum - take * qv / q_sum
        };
        kl += pn * (pn / qn.max(f64::MIN_POSITIVE)).ln();
    }
    kl
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn min_max_is_the_extremes_with_zero_inside() {
        let mut h = TensorHistogram::new();
        h.add(&[0.5, 2.0, 1.0]);
        h.add(&[3.0, 0.25]);
        assert_eq!(h.range(CalibrationMethod::MinMax), (0.0, 3.0));
        h.add(&[-1.5]);
        assert_eq!(h.range(CalibrationMethod::MinMax), (-1.5, 3.0));
    }

    #[test]
    fn extremes_skip_non_finite_values_at_any_position() {
        let mut values: Vec<f32> = (0..37).map(|i| i as f32 - 10.0).collect();
        assert_eq!(extremes(&values), (-10.0, 26.0));
        for (i, bad) in [(3, f32::NAN), (20, f32::INFINITY), (36, f32::NEG_INFINITY)] {
            values[i] = bad;
        }
        assert_eq!(extremes(&values), (-10.0, 35.0 - 10.0));
        assert_eq!(
            extremes(&[f32::NAN, f32::INFINITY]),
            (f32::INFINITY, f32::NEG_INFINITY)
        );
        assert_eq!(extremes(&[]), (f32::INFINITY, f32::NEG_INFINITY));
    }

    #[test]
    fn extremes_only_statistics_give_min_max_and_refuse_clipping() {
        let mut h = TensorHistogram::for_method(CalibrationMethod::MinMax);
        h.add(&[0.5, -2.0, 1.0]);
        h.add(&[f32::NAN, 3.0]);
        assert!(h.counts.is_empty());
        assert_eq!(h.range(CalibrationMethod::MinMax), (-2.0, 3.0));
        let full = TensorHistogram::for_method(CalibrationMethod::Entropy);
        assert_eq!(full.counts.len(), BINS);
        let refused = std::panic::catch_unwind(|| h.range(CalibrationMethod::Percentile(99.0)));
        assert!(refused.is_err());
    }

    #[test]
    fn growing_range_keeps_every_count() {
        let mut h = TensorHistogram::new();
        h.add(&[0.1; 100]);
        h.add(&[10.0; 50]);
        assert_eq!(h.counts.iter().sum::<u64>(), 150);
        assert!(h.amax >= 10.0);
    }

    #[test]
    fn percentile_clips_rare_outliers() {
        let mut h = TensorHistogram::new();
        let mut values: Vec<f32> = (0..100_000).map(|i| (i % 1000) as f32 / 1000.0).collect();
        values.push(100.0);
        h.add(&values);
        let (_, hi) = h.range(CalibrationMethod::Percentile(99.99));
        assert!(hi < 1.2, "{hi}");
        assert_eq!(h.range(CalibrationMethod::MinMax).1, 100.0);
    }

    #[test]
    fn entropy_keeps_a_uniform_range_and_clips_a_long_tail() {
        // Uniform on [0, 1]: clipping loses information, so the threshold stays near 1.
        let mut uniform = TensorHistogram::new();
        uniform.add(
            &(0..200_000)
                .map(|i| (i % 10_000) as f32 / 10_000.0)
                .collect::<Vec<_>>(),
        );
        let (_, hi) = uniform.range(CalibrationMethod::Entropy);
        assert!(hi > 0.9, "uniform clipped at {hi}");
        // Laplace-like bulk near zero plus one far outlier: clipped well below it.
        let mut tailed = TensorHistogram::new();
        let bulk: Vec<f32> = (1..200_000).map(|i| -(i as f32 / 200_000.0).ln() * 0.1).collect();
        tailed.add(&bulk);
        tailed.add(&[50.0]);
        let (_, hi) = tailed.range(CalibrationMethod::Entropy);
        assert!(hi > 0.3 && hi < 5.0, "tail clipped at {hi}");
    }

    #[test]
    fn empty_and_zero_tensors_have_a_zero_range() {
        assert_eq!(
            TensorHistogram::new().range(CalibrationMethod::Entropy),
            (0.0, 0.0)
        );
        let mut h = TensorHistogram::new();
        h.add(&[0.0; 10]);
        assert_eq!(h.range(CalibrationMethod::Entropy), (0.0, 0.0));
    }
}
