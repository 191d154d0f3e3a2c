//! The figures `peregrine quantize` prints after writing a model: detection parity with
//! the float model on held-out images. (Its speed lines are timed by `model_bench`, as
//! `bench-model --instances` times them.)

use std::path::PathBuf;

use anyhow::{Context, Result};
use peregrine_engine::Detector;
pub use peregrine_types::parity::Parity;
use peregrine_types::DetectParams;
use peregrine_vision::{decode_image, DecodedImage, ImageView};

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
