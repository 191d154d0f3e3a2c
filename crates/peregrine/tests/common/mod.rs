//! Helpers shared by the CLI integration tests.
#![allow(dead_code)]

pub mod raw;
pub mod repo;
pub mod server;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// The shared test material beside the checkout (`PEREGRINE_SHARED` overrides).
pub fn shared_dir() -> PathBuf {
    let dir = std::env::var_os("PEREGRINE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    assert!(
        dir.join("images").is_dir(),
        "test material not found at {} (set PEREGRINE_SHARED)",
        dir.display()
    );
    dir
}

/// The path of one of the shared test images.
pub fn image(name: &str) -> String {
    shared_dir().join("images").join(name).display().to_string()
}

/// The bytes of one of the shared test images.
pub fn image_bytes(name: &str) -> Vec<u8> {
    std::fs::read(image(name)).unwrap()
}

/// A directory of its own for one test, removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("peregrine-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }

    pub fn file(&self, name: &str, bytes: &[u8]) -> String {
        let p = self.0.join(name);
        std::fs::write(&p, bytes).unwrap();
        p.display().to_string()
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn peregrine(args: &[String]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_peregrine"))
        .args(args)
        .output()
        .expect("the peregrine binary runs")
}

/// Runs `peregrine` and parses each stdout line as JSON; panics with stderr on failure.
pub fn detect_json(args: &[String]) -> Vec<Value> {
    let out = peregrine(args);
    assert!(
        out.status.success(),
        "peregrine {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
        .collect()
}

#[derive(Debug, Clone, Copy)]
pub struct Det {
    pub class_id: u64,
    pub score: f64,
    pub bbox: [f64; 4],
}

impl Det {
    pub fn list(v: &Value) -> Vec<Det> {
        v.as_array()
            .expect("detections is an array")
            .iter()
            .map(|d| {
                let b: Vec<f64> = d["box"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap())
                    .collect();
                Det {
                    class_id: d["class_id"].as_u64().unwrap(),
                    score: d["score"].as_f64().unwrap(),
                    bbox: [b[0], b[1], b[2], b[3]],
                }
            })
            .collect()
    }

    pub fn iou(&self, o: &Det) -> f64 {
        let [a1, b1, a2, b2] = self.bbox;
        let [c1, d1, c2, d2] = o.bbox;
        let iw = (a2.min(c2) - a1.max(c1)).max(0.0);
        let ih = (b2.min(d2) - b1.max(d1)).max(0.0);
        let inter = iw * ih;
        let union = (a2 - a1) * (b2 - b1) + (c2 - c1) * (d2 - d1) - inter;
        if union > 0.0 {
            inter / union
        } else {
            0.0
        }
    }
}

/// Greedy one-to-one matching, best IoU first: pairs of the same class with IoU >= 0.9
/// and scores within 0.02. Returns the number of matched pairs.
pub fn matches(a: &[Det], b: &[Det]) -> usize {
    let mut pairs = Vec::new();
    for (i, x) in a.iter().enumerate() {
        for (j, y) in b.iter().enumerate() {
            let iou = x.iou(y);
            if x.class_id == y.class_id && iou >= 0.9 && (x.score - y.score).abs() <= 0.02 {
                pairs.push((iou, i, j));
            }
        }
    }
    pairs.sort_by(|p, q| q.0.total_cmp(&p.0));
    let (mut used_a, mut used_b) = (vec![false; a.len()], vec![false; b.len()]);
    let mut n = 0;
    for (_, i, j) in pairs {
        if !used_a[i] && !used_b[j] {
            used_a[i] = true;
            used_b[j] = true;
            n += 1;
        }
    }
    n
}

/// The reference detections of `model` on the shared images, by file name.
pub fn reference(model: &str) -> Vec<(String, Vec<Det>)> {
    let path = shared_dir().join("reference").join(format!("{model}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: Value = serde_json::from_str(&text).unwrap();
    let images = v["images"].as_object().expect("reference has an images map");
    images
        .iter()
        .map(|(name, img)| (name.clone(), Det::list(&img["detections"])))
        .collect()
}
