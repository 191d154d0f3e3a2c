//! Class-aware greedy non-maximum suppression.
//!
//! Candidates are visited best first; each is kept unless it overlaps an already kept box
//! of the same class by more than the IoU threshold (strictly more, as torchvision's `nms`).
//! Comparing against the kept boxes only, rather than suppressing forward over all
//! candidates, bounds the work by `candidates x kept-per-class` and stops at `max_det`.

use crate::postprocess::Candidate;

/// Reusable scratch for [`Nms::run`]; allocation-free once warmed up.
#[derive(Debug, Default)]
pub struct Nms {
    order: Vec<u64>,
    sort_scratch: Vec<u64>,
    /// Kept boxes grouped by class: (class, boxes as x1, y1, x2, y2, area).
    kept_by_class: Vec<(u32, Vec<[f32; 5]>)>,
    /// Class id to its index in `kept_by_class`, for ids below [`DIRECT_CLASSES`].
    group_of_class: Vec<u32>,
}

/// Class ids below this are looked up through a table; larger ones (only a broken model
/// produces them) by a linear search.
const DIRECT_CLASSES: u32 = 4096;
const NO_GROUP: u32 = u32::MAX;

/// Sorts by the upper 32 bits only, stably, with a least-significant-digit radix sort:
/// four byte-wide passes, skipping any byte that is the same in every key (the top byte of
/// scores in [0.25, 1] usually is). For thousands of keys this beats a comparison sort
/// several times over.
fn radix_sort_by_high_word(keys: &mut Vec<u64>, scratch: &mut Vec<u64>) {
    scratch.clear();
    scratch.resize(keys.len(), 0);
    for pass in 0..4 {
        let shift = 32 + pass * 8;
        let mut counts = [0usize; 256];
        for &k in keys.iter() {
            counts[((k >> shift) & 0xFF) as usize] += 1;
        }
        if counts.contains(&keys.len()) {
            continue;
        }
        let mut offset = 0;
        for c in counts.iter_mut() {
            let n = *c;
            *c = offset;
            offset += n;
        }
        for &k in keys.iter() {
            let d = ((k >> shift) & 0xFF) as usize;
            scratch[counts[d]] = k;
            counts[d] += 1;
        }
        std::mem::swap(keys, scratch);
    }
}

impl Nms {
    pub fn new() -> Self {
        Self::default()
    }

    /// Writes into `out` the indices of `candidates` that survive, best score first
    /// (ties: lower index first), at most `max_det` of them.
    pub fn run(
        &mut self,
        candidates: &[Candidate],
        iou_threshold: f32,
        max_det: usize,
        out: &mut Vec<usize>,
    ) {
        out.clear();
        self.order.clear();
        // Scores are non-negative after thresholding, so their bit patterns sort like the
        // floats; inverting them sorts best first and the index breaks ties stably.
        self.order.extend(candidates.iter().enumerate().map(|(i, c)| {
            let key = !c.score.max(0.0).to_bits();
            (u64::from(key) << 32) | i as u64
        }));
        // The low word (the index) is already ascending, so a stable sort on the score
        // alone leaves ties in index order.
        radix_sort_by_high_word(&mut self.order, &mut self.sort_scratch);
        for group in &mut self.kept_by_class {
            group.1.clear();
        }
        for k in 0..self.order.len() {
            let packed = self.order[k];
            if out.len() >= max_det {
                break;
            }
            let i = (packed & 0xFFFF_FFFF) as usize;
            let c = &candidates[i];
            let b = &c.bbox;
            let area = b.area();
            let group = self.group_index(c.class_id);
            let kept = &mut self.kept_by_class[group].1;
            let suppressed = kept.iter().any(|k| {
                let iw = (b.x2.min(k[2]) - b.x1.max(k[0])).max(0.0);
                let ih = (b.y2.min(k[3]) - b.y1.max(k[1])).max(0.0);
                let inter = iw * ih;
                let union = area + k[4] - inter;
                union > 0.0 && inter > iou_threshold * union
            });
            if !suppressed {
                kept.push([b.x1, b.y1, b.x2, b.y2, area]);
                out.push(i);
            }
        }
        // Keep the per-class table from growing without bound across very different inputs.
        if self.kept_by_class.len() > DIRECT_CLASSES as usize {
            self.kept_by_class.clear();
            self.group_of_class.clear();
        }
    }

    fn group_index(&mut self, class_id: u32) -> usize {
        if class_id < DIRECT_CLASSES {
            let slot = class_id as usize;
            if slot >= self.group_of_class.len() {
                self.group_of_class.resize(slot + 1, NO_GROUP);
            }
            if self.group_of_class[slot] == NO_GROUP {
                self.group_of_class[slot] = self.kept_by_class.len() as u32;
                self.kept_by_class.push((class_id, Vec::new()));
            }
            return self.group_of_class[slot] as usize;
        }
        match self.kept_by_class.iter().position(|g| g.0 == class_id) {
            Some(g) => g,
            None => {
                self.kept_by_class.push((class_id, Vec::new()));
                self.kept_by_class.len() - 1
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use peregrine_types::BBox;

    fn cand(class_id: u32, score: f32, x1: f32, y1: f32, x2: f32, y2: f32) -> Candidate {
        Candidate {
            class_id,
            score,
            bbox: BBox::new(x1, y1, x2, y2),
        }
    }

    fn run(c: &[Candidate], iou: f32, max_det: usize) -> Vec<usize> {
        let mut out = Vec::new();
        Nms::new().run(c, iou, max_det, &mut out);
        out
    }

    #[test]
    fn empty_input_gives_empty_output() {
        assert!(run(&[], 0.7, 300).is_empty());
    }

    #[test]
    fn single_box_is_kept() {
        assert_eq!(run(&[cand(0, 0.5, 0.0, 0.0, 1.0, 1.0)], 0.7, 300), [0]);
    }

    #[test]
    fn overlapping_same_class_keeps_the_best() {
        let c = [
            cand(0, 0.6, 0.0, 0.0, 10.0, 10.0),
            cand(0, 0.9, 0.5, 0.5, 10.5, 10.5),
            cand(0, 0.7, 1.0, 0.0, 11.0, 10.0),
        ];
        assert_eq!(run(&c, 0.5, 300), [1]);
    }

    #[test]
    fn class_aware_keeps_overlapping_boxes_of_other_classes() {
        let c = [
            cand(0, 0.9, 0.0, 0.0, 10.0, 10.0),
            cand(1, 0.8, 0.0, 0.0, 10.0, 10.0),
            cand(0, 0.7, 0.0, 0.0, 10.0, 10.0),
        ];
        assert_eq!(run(&c, 0.5, 300), [0, 1]);
    }

    #[test]
    fn all_overlapping_collapse_to_one() {
        let c: Vec<Candidate> = (0..100)
            .map(|i| cand(3, 0.3 + i as f32 * 0.001, 0.0, 0.0, 50.0, 50.0))
            .collect();
        assert_eq!(run(&c, 0.7, 300), [99]);
    }

    #[test]
    fn ties_keep_the_lower_index() {
        let c = [
            cand(0, 0.5, 0.0, 0.0, 10.0, 10.0),
            cand(0, 0.5, 0.0, 0.0, 10.0, 10.0),
        ];
        assert_eq!(run(&c, 0.7, 300), [0]);
    }

    #[test]
    fn iou_exactly_at_threshold_is_not_suppressed() {
        // IoU of these two is exactly 0.5.
        let c = [cand(0, 0.9, 0.0, 0.0, 2.0, 1.0), cand(0, 0.8, 0.0, 0.0, 1.0, 1.0)];
        assert_eq!(run(&c, 0.5, 300), [0, 1]);
        assert_eq!(run(&c, 0.49, 300), [0]);
    }

    #[test]
    fn disjoint_boxes_are_all_kept_best_first_up_to_max_det() {
        let c: Vec<Candidate> = (0..10)
            .map(|i| {
                cand(
                    0,
                    0.1 * i as f32,
                    i as f32 * 20.0,
                    0.0,
                    i as f32 * 20.0 + 10.0,
                    10.0,
                )
            })
            .collect();
        assert_eq!(run(&c, 0.7, 300), [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]);
        assert_eq!(run(&c, 0.7, 3), [9, 8, 7]);
    }

    #[test]
    fn degenerate_boxes_do_not_suppress() {
        let c = [cand(0, 0.9, 5.0, 5.0, 5.0, 5.0), cand(0, 0.8, 5.0, 5.0, 5.0, 5.0)];
        assert_eq!(run(&c, 0.5, 300), [0, 1]);
    }

    #[test]
    fn radix_sort_orders_by_score_then_index() {
        let mut keys: Vec<u64> = [
            (5u32, 0u32),
            (1, 1),
            (5, 2),
            (0xFFFF_FFFF, 3),
            (0, 4),
            (1 << 24, 5),
        ]
        .iter()
        .map(|&(hi, lo)| (u64::from(hi) << 32) | u64::from(lo))
        .collect();
        radix_sort_by_high_word(&mut keys, &mut Vec::new());
        let order: Vec<u32> = keys.iter().map(|k| *k as u32).collect();
        assert_eq!(order, [4, 1, 0, 2, 5, 3]);
    }

    #[test]
    fn huge_class_ids_still_work() {
        let c = [
            cand(u32::MAX - 1, 0.9, 0.0, 0.0, 10.0, 10.0),
            cand(u32::MAX - 1, 0.8, 0.0, 0.0, 10.0, 10.0),
        ];
        assert_eq!(run(&c, 0.5, 300), [0]);
    }

    #[test]
    fn scratch_reuse_does_not_leak_state() {
        let mut nms = Nms::new();
        let mut out = Vec::new();
        nms.run(&[cand(0, 0.9, 0.0, 0.0, 10.0, 10.0)], 0.5, 300, &mut out);
        nms.run(&[cand(0, 0.8, 0.0, 0.0, 10.0, 10.0)], 0.5, 300, &mut out);
        assert_eq!(out, [0]);
    }
}
