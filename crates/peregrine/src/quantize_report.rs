//! The figures `peregrine quantize` prints after writing a model: detection parity with
//! the float model on held-out images, and images per second of both on the CPU.

use std::fmt;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use peregrine_engine::{Detector, Slot};
use peregrine_types::{DetectParams, Detection};
use peregrine_vision::{decode_image, DecodedImage, ImageView, Letterbox};

/// A detection of one model matches one of the other when the class is the same, the
/// boxes overlap by at least this IoU and the scores differ by at most [`SCORE_TOLERANCE`].
pub const IOU_MATCH: f32 = 0.9;
pub const SCORE_TOLERANCE: f32 = 0.05;

/// Held-out images, decoded once.
pub struct Held {
    images: Vec<DecodedImage>,
}

impl Held {
    pub fn load(paths: &[PathBuf]) -> Result<Self> {
        let images = paths
            .iter()
            .map(|p| {
                let bytes = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
                decode_image(&bytes, Default::default()).with_context(|| p.display().to_string())
            })
            .collect::<Result<_>>()?;
        Ok(Self { images })
    }
}

/// Matched detections between a reference (float) and a candidate (int8) model.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Parity {
    pub images: usize,
    pub reference: usize,
    pub candidate: usize,
    pub matched: usize,
}

impl Parity {
    /// Share of the reference's detections the candidate found (1 when there were none).
    pub fn recall(&self) -> f64 {
        ratio(self.matched, self.reference)
    }

    /// Share of the candidate's detections the reference has.
    pub fn precision(&self) -> f64 {
        ratio(self.matched, self.candidate)
    }

    /// Adds one image's detections, matched greedily best reference first.
    pub fn add(&mut self, reference: &[Detection], candidate: &[Detection]) {
        self.images += 1;
        self.reference += reference.len();
        self.candidate += candidate.len();
        let mut taken = vec![false; candidate.len()];
        for r in reference {
            let best = candidate
                .iter()
                .enumerate()
                .filter(|(i, c)| {
                    !taken[*i]
                        && c.class_id == r.class_id
                        && (c.score - r.score).abs() <= SCORE_TOLERANCE
                        && c.bbox.iou(&r.bbox) >= IOU_MATCH
                })
                .max_by(|a, b| a.1.bbox.iou(&r.bbox).total_cmp(&b.1.bbox.iou(&r.bbox)));
            if let Some((i, _)) = best {
                taken[i] = true;
                self.matched += 1;
            }
        }
    }
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 {
        1.0
    } else {
        a as f64 / b as f64
    }
}

impl fmt::Display for Parity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "parity with the float model on {} held-out images: recall {:.1}% ({}/{}), precision {:.1}% ({}/{}) \
             (same class, IoU >= {IOU_MATCH}, score within {SCORE_TOLERANCE})",
            self.images,
            100.0 * self.recall(),
            self.matched,
            self.reference,
            100.0 * self.precision(),
            self.matched,
            self.candidate
        )
    }
}

/// Both models' detections on the held-out images, compared.
pub fn parity(reference: &mut Detector, candidate: &mut Detector, held: &Held) -> Result<Parity> {
    let params = DetectParams::default();
    let mut parity = Parity::default();
    for image in &held.images {
        let view = [ImageView::from(&image.rgb)];
        let (r, _) = reference.detect(&view, &params)?;
        let (c, _) = candidate.detect(&view, &params)?;
        parity.add(&r[0], &c[0]);
    }
    Ok(parity)
}

/// Images per second of `detector` on gray canvases at `batch`, after its warm-up runs.
pub fn images_per_s(detector: &mut Detector, batch: usize, seconds: f64) -> Result<f64> {
    let spec = detector.spec().clone();
    let canvas = vec![Letterbox::PAD_VALUE; spec.image_len()];
    let letterbox = Letterbox::new(
        spec.input_width,
        spec.input_height,
        spec.input_width,
        spec.input_height,
    );
    let slots: Vec<Slot> = (0..batch)
        .map(|_| Slot::Canvas {
            canvas: canvas.clone(),
            letterbox,
            params: DetectParams::default(),
        })
        .collect();
    for _ in 0..detector.warm_up_runs() {
        detector.run_prepared(&slots)?;
    }
    let start = Instant::now();
    let mut runs = 0;
    while start.elapsed().as_secs_f64() < seconds {
        detector.run_prepared(&slots)?;
        runs += 1;
    }
    Ok((runs * batch) as f64 / start.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use peregrine_types::BBox;

    fn det(class_id: u32, score: f32, x: f32) -> Detection {
        Detection {
            class_id,
            score,
            bbox: BBox::new(x, 0.0, x + 100.0, 100.0),
        }
    }

    #[test]
    fn matches_need_class_overlap_and_close_scores() {
        let mut p = Parity::default();
        p.add(
            &[det(0, 0.9, 0.0), det(1, 0.8, 300.0), det(2, 0.7, 600.0)],
            &[
                det(0, 0.88, 1.0),
                det(5, 0.8, 300.0),
                det(2, 0.5, 600.0),
                det(3, 0.4, 900.0),
            ],
        );
        assert_eq!((p.reference, p.candidate, p.matched), (3, 4, 1));
        assert!((p.recall() - 1.0 / 3.0).abs() < 1e-9);
        assert!((p.precision() - 0.25).abs() < 1e-9);
    }
}
