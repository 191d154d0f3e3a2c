//! Raw model rows to final detections: threshold, best class, NMS, map back to the image.

use peregrine_types::{BBox, DetectParams, Detection};

use crate::layout::OutputLayout;
use crate::letterbox::Letterbox;
use crate::nms::Nms;

/// A box before NMS, in model-input pixels.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    pub class_id: u32,
    pub score: f32,
    pub bbox: BBox,
}

/// Reusable scratch for turning one image's output rows into detections.
#[derive(Debug, Default)]
pub struct Postprocessor {
    best_score: Vec<f32>,
    best_class: Vec<u32>,
    candidates: Vec<Candidate>,
    nms: Nms,
    keep: Vec<usize>,
}

impl Postprocessor {
    pub fn new() -> Self {
        Self::default()
    }

    /// Decodes one image's slice of the output (`rows` candidates in `layout`) and appends
    /// the surviving detections, in original-image pixels, best first, to `out`.
    pub fn process(
        &mut self,
        layout: OutputLayout,
        output: &[f32],
        rows: usize,
        params: &DetectParams,
        letterbox: &Letterbox,
        out: &mut Vec<Detection>,
    ) {
        self.candidates.clear();
        match layout {
            OutputLayout::ChannelsFirst { num_classes } => {
                self.channels_first(output, rows, num_classes, params)
            }
            OutputLayout::AnchorsFirstWithObjectness { num_classes } => {
                self.anchors_first(output, rows, num_classes, params)
            }
            OutputLayout::EndToEnd | OutputLayout::Candidates => self.rows_of_six(output, rows, params),
        }
        let start = out.len();
        if layout.needs_nms() {
            self.nms
                .run(&self.candidates, params.iou, params.max_det, &mut self.keep);
            out.extend(
                self.keep
                    .iter()
                    .map(|&i| self.candidates[i])
                    .map(|c| finish(c, letterbox)),
            );
        } else {
            // End-to-end rows arrive ranked; keep the model's order, best first.
            self.candidates
                .sort_by(|a, b| b.score.partial_cmp(&a.score).unwrap_or(std::cmp::Ordering::Equal));
            self.candidates.truncate(params.max_det);
            out.extend(self.candidates.iter().map(|&c| finish(c, letterbox)));
        }
        debug_assert!(out.len() - start <= params.max_det);
    }

    /// `[4 + C, A]`: the best class per anchor is found one class row at a time, which reads
    /// memory in order instead of striding across rows for every anchor.
    fn channels_first(&mut self, output: &[f32], anchors: usize, num_classes: usize, params: &DetectParams) {
        let row = |r: usize| &output[r * anchors..(r + 1) * anchors];
        self.best_score.clear();
        self.best_score.extend_from_slice(row(4));
        self.best_class.clear();
        self.best_class.resize(anchors, 0);
        for c in 1..num_classes {
            let scores = row(4 + c);
            keep_best_class(
                &mut self.best_score[..anchors],
                &mut self.best_class[..anchors],
                scores,
                c as u32,
            );
        }
        let (cx, cy, w, h) = (row(0), row(1), row(2), row(3));
        for a in 0..anchors {
            let score = self.best_score[a];
            if score > params.conf && params.wants_class(self.best_class[a]) {
                push_finite(
                    &mut self.candidates,
                    self.best_class[a],
                    score,
                    BBox::from_cxcywh(cx[a], cy[a], w[a], h[a]),
                );
            }
        }
    }

    /// `[A, 5 + C]`: score is objectness times the class score, as YOLOv5 computes it.
    fn anchors_first(&mut self, output: &[f32], anchors: usize, num_classes: usize, params: &DetectParams) {
        let width = 5 + num_classes;
        for r in output.chunks_exact(width).take(anchors) {
            let objectness = r[4];
            if objectness <= params.conf {
                continue;
            }
            let (mut best, mut cls) = (f32::NEG_INFINITY, 0u32);
            for (c, &s) in r[5..].iter().enumerate() {
                if s > best {
                    best = s;
                    cls = c as u32;
                }
            }
            let score = best * objectness;
            if score > params.conf && params.wants_class(cls) {
                push_finite(
                    &mut self.candidates,
                    cls,
                    score,
                    BBox::from_cxcywh(r[0], r[1], r[2], r[3]),
                );
            }
        }
    }

    /// `[K, 6]`: x1, y1, x2, y2, score, class (end-to-end heads and rewritten candidates).
    fn rows_of_six(&mut self, output: &[f32], rows: usize, params: &DetectParams) {
        for r in output.chunks_exact(6).take(rows) {
            let score = r[4];
            let class = r[5];
            // Written so that NaN in either field fails the test.
            let usable = score > params.conf && class >= 0.0 && class < u32::MAX as f32;
            if !usable {
                continue;
            }
            let cls = class.round() as u32;
            if params.wants_class(cls) {
                push_finite(
                    &mut self.candidates,
                    cls,
                    score,
                    BBox::new(r[0], r[1], r[2], r[3]),
                );
            }
        }
    }
}

/// Folds one class's scores into the running best score and class per anchor. Branch-free
/// selects over equal-length slices compile to vector blends (AVX2 where available).
#[multiversion::multiversion(targets("x86_64+avx2+fma", "x86_64+sse4.1"))]
fn keep_best_class(best: &mut [f32], class: &mut [u32], scores: &[f32], c: u32) {
    let n = best.len();
    let (class, scores) = (&mut class[..n], &scores[..n]);
    for a in 0..n {
        let greater = scores[a] > best[a];
        best[a] = if greater { scores[a] } else { best[a] };
        class[a] = if greater { c } else { class[a] };
    }
}

/// Drops boxes with NaN or infinite corners: a broken model must not produce broken JSON.
fn push_finite(out: &mut Vec<Candidate>, class_id: u32, score: f32, bbox: BBox) {
    if [bbox.x1, bbox.y1, bbox.x2, bbox.y2].iter().all(|v| v.is_finite()) {
        out.push(Candidate {
            class_id,
            score,
            bbox,
        });
    }
}

fn finish(c: Candidate, letterbox: &Letterbox) -> Detection {
    Detection {
        class_id: c.class_id,
        score: c.score,
        bbox: letterbox.to_original(&c.bbox),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> Letterbox {
        Letterbox::new(640, 640, 640, 640)
    }

    /// Builds a `[4 + C, A]` tensor from (cx, cy, w, h, class, score) per anchor.
    fn channels_first_tensor(num_classes: usize, anchors: &[(f32, f32, f32, f32, usize, f32)]) -> Vec<f32> {
        let a = anchors.len();
        let mut t = vec![0.0; (4 + num_classes) * a];
        for (i, &(cx, cy, w, h, cls, score)) in anchors.iter().enumerate() {
            t[i] = cx;
            t[a + i] = cy;
            t[2 * a + i] = w;
            t[3 * a + i] = h;
            t[(4 + cls) * a + i] = score;
        }
        t
    }

    fn run(layout: OutputLayout, t: &[f32], rows: usize, params: &DetectParams) -> Vec<Detection> {
        let mut out = Vec::new();
        Postprocessor::new().process(layout, t, rows, params, &identity(), &mut out);
        out
    }

    #[test]
    fn channels_first_picks_best_class_thresholds_and_suppresses() {
        let t = channels_first_tensor(
            3,
            &[
                (100.0, 100.0, 20.0, 20.0, 2, 0.9),
                (101.0, 100.0, 20.0, 20.0, 2, 0.8), // duplicate of the first
                (300.0, 300.0, 40.0, 20.0, 1, 0.6),
                (500.0, 500.0, 10.0, 10.0, 0, 0.2), // under conf
            ],
        );
        let layout = OutputLayout::ChannelsFirst { num_classes: 3 };
        let d = run(layout, &t, 4, &DetectParams::default());
        assert_eq!(d.len(), 2);
        assert_eq!((d[0].class_id, d[0].score), (2, 0.9));
        assert_eq!(d[0].bbox, BBox::new(90.0, 90.0, 110.0, 110.0));
        assert_eq!(
            (d[1].class_id, d[1].bbox),
            (1, BBox::new(280.0, 290.0, 320.0, 310.0))
        );
    }

    #[test]
    fn class_filter_applies_after_best_class() {
        // Best class 2 (0.9); class 1 at 0.5 must not resurface when only class 1 is wanted.
        let mut t = channels_first_tensor(3, &[(100.0, 100.0, 20.0, 20.0, 2, 0.9)]);
        t[5] = 0.5;
        let layout = OutputLayout::ChannelsFirst { num_classes: 3 };
        let only_1 = DetectParams {
            classes: Some(vec![1]),
            ..Default::default()
        };
        assert!(run(layout, &t, 1, &only_1).is_empty());
        let only_2 = DetectParams {
            classes: Some(vec![2]),
            ..Default::default()
        };
        assert_eq!(run(layout, &t, 1, &only_2).len(), 1);
    }

    #[test]
    fn max_det_caps_output() {
        let anchors: Vec<_> = (0..50)
            .map(|i| (i as f32 * 12.0 + 6.0, 6.0, 10.0, 10.0, 0, 0.5 + i as f32 * 0.001))
            .collect();
        let t = channels_first_tensor(1, &anchors);
        let p = DetectParams {
            max_det: 7,
            ..Default::default()
        };
        let d = run(OutputLayout::ChannelsFirst { num_classes: 1 }, &t, 50, &p);
        assert_eq!(d.len(), 7);
        assert!(d.windows(2).all(|w| w[0].score >= w[1].score));
    }

    #[test]
    fn anchors_first_multiplies_objectness() {
        // cx, cy, w, h, obj, c0, c1
        let t = [
            50.0, 50.0, 10.0, 10.0, 0.9, 0.1, 0.8, // 0.72 for class 1
            200.0, 200.0, 10.0, 10.0, 0.2, 1.0, 0.0, // objectness under conf
            400.0, 400.0, 10.0, 10.0, 0.5, 0.4, 0.1, // 0.2: under conf after product
        ];
        let d = run(
            OutputLayout::AnchorsFirstWithObjectness { num_classes: 2 },
            &t,
            3,
            &DetectParams::default(),
        );
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].class_id, 1);
        assert!((d[0].score - 0.72).abs() < 1e-6);
        assert_eq!(d[0].bbox, BBox::new(45.0, 45.0, 55.0, 55.0));
    }

    #[test]
    fn end_to_end_keeps_overlaps_and_sorts() {
        let t = [
            10.0,
            10.0,
            50.0,
            50.0,
            0.5,
            3.0, //
            10.0,
            10.0,
            50.0,
            50.0,
            0.8,
            3.0, // overlapping, same class: e2e keeps both
            0.0,
            0.0,
            1.0,
            1.0,
            0.1,
            0.0, // under conf
            0.0,
            0.0,
            1.0,
            1.0,
            f32::NAN,
            0.0, // broken row
            0.0,
            0.0,
            1.0,
            1.0,
            0.9,
            -1.0, // negative class
        ];
        let d = run(OutputLayout::EndToEnd, &t, 5, &DetectParams::default());
        assert_eq!(d.len(), 2);
        assert_eq!((d[0].score, d[1].score), (0.8, 0.5));
        assert_eq!(d[0].class_id, 3);
    }

    #[test]
    fn non_finite_boxes_are_dropped() {
        let t = channels_first_tensor(
            1,
            &[
                (f32::NAN, 10.0, 5.0, 5.0, 0, 0.9),
                (f32::INFINITY, 1.0, 1.0, 1.0, 0, 0.9),
            ],
        );
        assert!(run(
            OutputLayout::ChannelsFirst { num_classes: 1 },
            &t,
            2,
            &DetectParams::default()
        )
        .is_empty());
    }

    #[test]
    fn boxes_are_mapped_to_original_pixels() {
        let t = channels_first_tensor(1, &[(320.0, 320.0, 640.0, 360.0, 0, 0.9)]);
        let lb = Letterbox::new(1280, 720, 640, 640);
        let mut out = Vec::new();
        Postprocessor::new().process(
            OutputLayout::ChannelsFirst { num_classes: 1 },
            &t,
            1,
            &DetectParams::default(),
            &lb,
            &mut out,
        );
        let b = out[0].bbox;
        assert!((b.x1).abs() < 1e-3 && (b.y1).abs() < 1e-3);
        assert!((b.x2 - 1280.0).abs() < 1e-3 && (b.y2 - 720.0).abs() < 1e-3);
    }
}
