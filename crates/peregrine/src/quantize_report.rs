//! The figures `peregrine quantize` prints after writing a model: detection parity with
//! the float model on held-out images, and images per second of both on the CPU.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use peregrine_engine::{Detector, Slot};
pub use peregrine_types::parity::Parity;
use peregrine_types::DetectParams;
use peregrine_vision::{decode_image, DecodedImage, ImageView, Letterbox};

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

/// Images per second of `detector` on gray canvases at `batch`, after its warm-up runs.
pub fn images_per_s(detector: &mut Detector, batch: usize, seconds: f64) -> Result<f64> {
    instances_images_per_s(std::slice::from_mut(detector), batch, seconds)
}

/// Images per second of all `detectors` together, each on its own thread at `batch` (as the
/// server runs its instances), timed from when every one has finished its warm-up.
pub fn instances_images_per_s(detectors: &mut [Detector], batch: usize, seconds: f64) -> Result<f64> {
    let start = std::sync::Barrier::new(detectors.len());
    std::thread::scope(|scope| {
        let threads: Vec<_> = detectors
            .iter_mut()
            .map(|detector| {
                let start = &start;
                scope.spawn(move || timed_runs(detector, batch, seconds, start))
            })
            .collect();
        let mut total = 0.0;
        for thread in threads {
            total += thread
                .join()
                .map_err(|_| anyhow::anyhow!("a timing thread panicked"))??;
        }
        Ok(total)
    })
}

/// One detector's images per second; waits at `start` between its warm-up and the clock.
/// An instance whose warm-up fails still meets the others there, so none waits forever.
fn timed_runs(
    detector: &mut Detector,
    batch: usize,
    seconds: f64,
    start: &std::sync::Barrier,
) -> Result<f64> {
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
    let warm_up = (0..detector.warm_up_runs()).try_for_each(|_| detector.run_prepared(&slots).map(drop));
    start.wait();
    warm_up?;
    let clock = Instant::now();
    let mut runs = 0;
    while clock.elapsed().as_secs_f64() < seconds {
        detector.run_prepared(&slots)?;
        runs += 1;
    }
    Ok((runs * batch) as f64 / clock.elapsed().as_secs_f64())
}
