//! How far two models' detections on the same images agree: the measure of an INT8 model
//! against its float source (`peregrine quantize`'s summary and search, and the online
//! calibration's check before it publishes).

use std::fmt;

use crate::Detection;

/// A detection of one model matches one of the other when the class is the same, the
/// boxes overlap by at least this IoU and the scores differ by at most [`SCORE_TOLERANCE`].
pub const IOU_MATCH: f32 = 0.9;
pub const SCORE_TOLERANCE: f32 = 0.05;

/// Matched detections between a reference (float) and a candidate (int8) model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BBox;

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
