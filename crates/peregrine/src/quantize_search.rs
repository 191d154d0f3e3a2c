//! `peregrine quantize --search-float N`: which layers to keep float, decided by measurement.
//!
//! Greedy over the model's layer groups (Ultralytics' modules: `/model.3/`, `/model.23/`,
//! ...): each round quantizes the model once per group not yet kept float, with that group
//! kept float too, measures the result's parity with the float model on the held-out
//! images, and keeps the group that raised parity most. The search stops at the target,
//! after N rounds, or when no group raises parity. [`FloatSearch`] holds the decisions as
//! plain state; [`run`] is the loop that builds and measures the models.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result};
use peregrine_onnx::quantize::{quantize_qdq, QdqOptions, Quantized};

use crate::quantize_report::{self, Held, Parity};

/// The group a node belongs to: its name up to and including the second `/` (Ultralytics'
/// exports name nodes `/model.N/...`, so a group is one module), or the whole name.
pub fn group_of(node: &str) -> &str {
    match node.match_indices('/').nth(1) {
        Some((i, _)) => &node[..=i],
        None => node,
    }
}

/// The distinct groups of `nodes`, in their first node's order.
pub fn groups(nodes: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for node in nodes {
        let group = group_of(node);
        if !out.iter().any(|g| g == group) {
            out.push(group.to_string());
        }
    }
    out
}

/// How good a parity is for the search: matched detections over both models' detections
/// (the F1 score), so that losing a detection and inventing one weigh the same.
fn score(p: &Parity) -> f64 {
    let total = p.reference + p.candidate;
    if total == 0 {
        1.0
    } else {
        2.0 * p.matched as f64 / total as f64
    }
}

/// One kept group and the parity it brought.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub group: String,
    pub parity: Parity,
}

/// The greedy search's state: groups kept so far, the current parity, this round's figures.
#[derive(Debug, Clone)]
pub struct FloatSearch {
    groups: Vec<String>,
    kept: Vec<Step>,
    current: Parity,
    round: Vec<(String, Parity)>,
    rounds_left: usize,
    target: f64,
}

impl FloatSearch {
    /// `baseline`: the parity with nothing more kept float; `rounds`: most groups to keep;
    /// `target`: the recall and precision at which to stop.
    pub fn new(groups: Vec<String>, baseline: Parity, rounds: usize, target: f64) -> Self {
        Self {
            groups,
            kept: Vec::new(),
            current: baseline,
            round: Vec::new(),
            rounds_left: rounds,
            target,
        }
    }

    fn reached(&self) -> bool {
        self.current.recall() >= self.target && self.current.precision() >= self.target
    }

    /// The groups to measure this round (none once the search is over).
    pub fn candidates(&self) -> Vec<String> {
        if self.rounds_left == 0 || self.reached() {
            return Vec::new();
        }
        self.groups
            .iter()
            .filter(|g| !self.kept.iter().any(|s| &s.group == *g))
            .cloned()
            .collect()
    }

    /// The exclusions to quantize with when `group` is tried: those kept so far and it.
    pub fn exclusions_with(&self, group: &str) -> Vec<String> {
        self.kept
            .iter()
            .map(|s| s.group.clone())
            .chain(std::iter::once(group.to_string()))
            .collect()
    }

    /// Records the parity measured with `group` kept float as well.
    pub fn observe(&mut self, group: &str, parity: Parity) {
        self.round.push((group.to_string(), parity));
    }

    /// Ends a round: keeps its best group if it raised parity (the first measured wins a
    /// tie). Returns the step taken, or `None` when the search is over.
    pub fn finish_round(&mut self) -> Option<Step> {
        let round = std::mem::take(&mut self.round);
        let best = round
            .into_iter()
            .fold(None::<(String, Parity)>, |best, (g, p)| match best {
                Some((bg, bp)) if score(&bp) >= score(&p) => Some((bg, bp)),
                _ => Some((g, p)),
            });
        match best {
            Some((group, parity)) if score(&parity) > score(&self.current) => {
                let step = Step { group, parity };
                self.kept.push(step.clone());
                self.current = parity;
                self.rounds_left = self.rounds_left.saturating_sub(1);
                Some(step)
            }
            _ => {
                self.rounds_left = 0;
                None
            }
        }
    }

    /// The groups kept float, in the order they were chosen.
    pub fn kept(&self) -> Vec<String> {
        self.kept.iter().map(|s| s.group.clone()).collect()
    }

    pub fn parity(&self) -> Parity {
        self.current
    }
}

/// What the search needs to build and measure a candidate.
pub struct SearchInputs<'a> {
    pub model: &'a [u8],
    pub ranges: &'a HashMap<String, (f32, f32)>,
    pub options: &'a QdqOptions,
    pub held: &'a Held,
    /// Where candidates are written while they are measured (removed afterwards, also
    /// when the search fails).
    pub scratch: &'a Path,
    pub rounds: usize,
    pub target: f64,
}

/// Removes the candidate file however the search ends.
struct Scratch<'a>(&'a Path);

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0);
    }
}

/// Runs the search from `options`' selection; returns the groups to keep float as well.
/// `load` builds a detector from a model file; `float` is the float model's.
pub fn run(
    inputs: &SearchInputs<'_>,
    float: &mut peregrine_engine::Detector,
    load: &dyn Fn(&Path) -> Result<peregrine_engine::Detector>,
) -> Result<FloatSearch> {
    let scratch = Scratch(inputs.scratch);
    let quantize = |extra: &[String]| -> Result<Quantized> {
        let mut options = inputs.options.clone();
        options.selection.exclude.extend(extra.iter().cloned());
        quantize_qdq(inputs.model, inputs.ranges, &options).context("writing a candidate")
    };
    let measure = |candidate: &Quantized, float: &mut peregrine_engine::Detector| -> Result<Parity> {
        std::fs::write(scratch.0, &candidate.model)
            .with_context(|| format!("writing {}", scratch.0.display()))?;
        let mut candidate = load(scratch.0)?;
        quantize_report::parity(float, &mut candidate, inputs.held)
    };
    let base = quantize(&[])?;
    let baseline = measure(&base, float)?;
    println!("search: as selected, {baseline}");
    let mut search = FloatSearch::new(groups(&base.nodes), baseline, inputs.rounds, inputs.target);
    loop {
        let candidates = search.candidates();
        if candidates.is_empty() {
            break;
        }
        for group in &candidates {
            let parity = measure(&quantize(&search.exclusions_with(group))?, float)?;
            println!(
                "search: {group} float too: recall {:.1}%, precision {:.1}%",
                100.0 * parity.recall(),
                100.0 * parity.precision()
            );
            search.observe(group, parity);
        }
        match search.finish_round() {
            Some(step) => println!("search: keeping {} float, {}", step.group, step.parity),
            None => println!("search: no group raises parity further"),
        }
    }
    Ok(search)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parity(matched: usize) -> Parity {
        Parity {
            images: 4,
            reference: 10,
            candidate: 10,
            matched,
        }
    }

    #[test]
    fn groups_are_modules() {
        assert_eq!(group_of("/model.23/cv2.0/cv2.0.0/conv/Conv"), "/model.23/");
        assert_eq!(group_of("/model.0/conv/Conv"), "/model.0/");
        assert_eq!(group_of("conv1"), "conv1");
        let nodes = ["/model.0/conv/Conv", "/model.1/conv/Conv", "/model.0/act/Mul"].map(String::from);
        assert_eq!(groups(&nodes), ["/model.0/", "/model.1/"]);
    }

    #[test]
    fn keeps_the_best_group_each_round_until_the_target() {
        let groups = ["/a/", "/b/", "/c/"].map(String::from).to_vec();
        let mut s = FloatSearch::new(groups, parity(6), 3, 0.9);
        assert_eq!(s.candidates(), ["/a/", "/b/", "/c/"]);
        s.observe("/a/", parity(7));
        s.observe("/b/", parity(8));
        s.observe("/c/", parity(8));
        let step = s.finish_round().expect("a group raised parity");
        assert_eq!(step.group, "/b/", "the first of equals wins");
        assert_eq!(s.candidates(), ["/a/", "/c/"]);
        assert_eq!(s.exclusions_with("/c/"), ["/b/", "/c/"]);
        s.observe("/a/", parity(9));
        s.observe("/c/", parity(8));
        assert_eq!(s.finish_round().map(|s| s.group), Some("/a/".into()));
        assert!(s.candidates().is_empty(), "0.9 reached: nothing more to try");
        assert_eq!(s.kept(), ["/b/", "/a/"]);
        assert_eq!(s.parity().matched, 9);
    }

    #[test]
    fn stops_when_nothing_helps_or_rounds_run_out() {
        let groups = ["/a/", "/b/"].map(String::from).to_vec();
        let mut s = FloatSearch::new(groups.clone(), parity(6), 3, 1.0);
        s.observe("/a/", parity(6));
        s.observe("/b/", parity(5));
        assert_eq!(s.finish_round(), None);
        assert!(s.candidates().is_empty());
        assert!(s.kept().is_empty());

        let mut s = FloatSearch::new(groups, parity(6), 1, 1.0);
        s.observe("/a/", parity(7));
        assert!(s.finish_round().is_some());
        assert!(s.candidates().is_empty(), "one round allowed");
    }

    #[test]
    fn inventing_a_detection_counts_as_losing_one() {
        let lost = Parity {
            images: 1,
            reference: 10,
            candidate: 9,
            matched: 9,
        };
        let invented = Parity {
            images: 1,
            reference: 10,
            candidate: 11,
            matched: 10,
        };
        assert!((score(&lost) - score(&invented)).abs() < 0.01);
    }
}
