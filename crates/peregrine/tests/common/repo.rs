//! A model repository of the test's own, in a temporary directory.

use std::path::{Path, PathBuf};

/// A temporary repository whose versions are hard links to the embedded model's file, so
/// twenty versions cost no disk; a small input size keeps loads and warm-ups quick.
pub struct Repo(pub PathBuf);

impl Repo {
    pub fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("peregrine-repo-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("det")).unwrap();
        std::fs::write(
            dir.join("det/config.toml"),
            "imgsz = [320, 320]\nmax_batch = 2\nthreads = 1\n",
        )
        .unwrap();
        Self(dir)
    }

    pub fn model() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/yolo11n.onnx")
    }

    pub fn add_version(&self, v: u64) {
        let dir = self.0.join("det").join(v.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::hard_link(Self::model(), dir.join("model.onnx")).unwrap();
    }

    pub fn add_broken_version(&self, v: u64, bytes: &[u8]) {
        let dir = self.0.join("det").join(v.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("model.onnx"), bytes).unwrap();
    }

    pub fn arg(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for Repo {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
