//! Detector tests over a fake backend: batch splitting, padding, fixed batch sizes.

use super::*;
use peregrine_backend::{BackendError, ModelDescription};
use peregrine_types::model::ElementType;
use peregrine_types::{Dim, TensorDescription};
use std::sync::{Arc, Mutex};

/// A backend that returns a fixed end-to-end row per image and records batch shapes.
struct FakeBackend {
    description: ModelDescription,
    seen: Arc<Mutex<Vec<[usize; 4]>>>,
    input: Vec<f32>,
}

impl FakeBackend {
    fn new(batch: Dim) -> (Self, Arc<Mutex<Vec<[usize; 4]>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let t = |name: &str, dims| TensorDescription {
            name: name.into(),
            element: ElementType::F32,
            dims,
        };
        let description = ModelDescription {
            inputs: vec![t(
                "images",
                vec![batch, Dim::Fixed(3), Dim::Fixed(64), Dim::Fixed(64)],
            )],
            outputs: vec![t("output0", vec![batch, Dim::Fixed(2), Dim::Fixed(6)])],
            metadata: [("end2end".to_string(), "True".to_string())].into(),
        };
        (
            Self {
                description,
                seen: seen.clone(),
                input: Vec::new(),
            },
            seen,
        )
    }
}

impl Backend for FakeBackend {
    fn description(&self) -> &ModelDescription {
        &self.description
    }

    fn input(&mut self, shape: [usize; 4]) -> Result<InputBuffer<'_>, BackendError> {
        self.input.resize(shape.iter().product(), f32::NAN);
        Ok(InputBuffer::F32(&mut self.input))
    }

    fn run(&mut self, shape: [usize; 4], output: &mut OutputBuffer) -> Result<(), BackendError> {
        self.seen.lock().unwrap().push(shape);
        let n = shape[0];
        output.shape = vec![n, 2, 6];
        output.data.clear();
        for i in 0..n {
            // The mean of the image's first plane tells images apart.
            let plane = &self.input[i * 3 * 64 * 64..][..64 * 64];
            let mean = plane.iter().sum::<f32>() / plane.len() as f32;
            output.data.extend_from_slice(&[0.0, 0.0, 32.0, 32.0, mean, 1.0]);
            output.data.extend_from_slice(&[0.0, 0.0, 1.0, 1.0, 0.01, 0.0]);
        }
        Ok(())
    }
}

fn gray(v: u8) -> Vec<u8> {
    vec![v; 64 * 64 * 3]
}

#[test]
fn batches_are_split_and_results_stay_in_order() {
    let (backend, seen) = FakeBackend::new(Dim::Dynamic);
    let mut det = Detector::new(
        Box::new(backend),
        &DetectorConfig {
            imgsz: None,
            max_batch: 2,
            run_sizes: vec![],
        },
    )
    .unwrap();
    let pixels = [gray(255), gray(128), gray(200)];
    let views: Vec<_> = pixels
        .iter()
        .map(|p| ImageView::packed(p, 64, 64).unwrap())
        .collect();
    let (res, _) = det.detect(&views, &DetectParams::default()).unwrap();
    assert_eq!(*seen.lock().unwrap(), [[2, 3, 64, 64], [1, 3, 64, 64]]);
    let scores: Vec<f32> = res.iter().map(|d| d[0].score).collect();
    assert!((scores[0] - 1.0).abs() < 1e-3 && (scores[1] - 128.0 / 255.0).abs() < 1e-3);
    assert!((scores[2] - 200.0 / 255.0).abs() < 1e-3);
    assert!(res.iter().all(|d| d.len() == 1), "the 0.01 row is under conf");
}

#[test]
fn batches_are_padded_up_to_the_next_run_size() {
    let (backend, seen) = FakeBackend::new(Dim::Dynamic);
    let mut det = Detector::new(
        Box::new(backend),
        &DetectorConfig {
            imgsz: None,
            max_batch: 8,
            run_sizes: vec![1, 4],
        },
    )
    .unwrap();
    assert_eq!(det.run_sizes(8), [1, 4, 8]);
    assert_eq!(det.run_sizes(3), [1, 4]);
    let pixels: Vec<Vec<u8>> = (0..5u8).map(|v| gray(100 + v)).collect();
    let views: Vec<_> = pixels
        .iter()
        .map(|p| ImageView::packed(p, 64, 64).unwrap())
        .collect();
    let (res, _) = det.detect(&views[..3], &DetectParams::default()).unwrap();
    let (res5, _) = det.detect(&views, &DetectParams::default()).unwrap();
    assert_eq!(*seen.lock().unwrap(), [[4, 3, 64, 64], [8, 3, 64, 64]]);
    assert_eq!((res.len(), res5.len()), (3, 5), "padding slots give no results");
    assert!((res5[4][0].score - 104.0 / 255.0).abs() < 1e-3);
}

#[test]
fn fixed_batch_models_get_padded_batches() {
    let (backend, seen) = FakeBackend::new(Dim::Fixed(4));
    let mut det = Detector::new(Box::new(backend), &DetectorConfig::default()).unwrap();
    assert_eq!(det.batch_size(), 4);
    let p = gray(255);
    let (res, _) = det
        .detect(
            &[ImageView::packed(&p, 64, 64).unwrap()],
            &DetectParams::default(),
        )
        .unwrap();
    assert_eq!(*seen.lock().unwrap(), [[4, 3, 64, 64]]);
    assert_eq!(res.len(), 1);
}
