//! A fake model for the engine's tests: 32x32 inputs, an end-to-end output of one row per
//! image whose class is the image's red value, and a configurable delay per batch.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use peregrine_backend::{Backend, BackendError, InputBuffer, ModelDescription, OutputBuffer};
use peregrine_types::model::ElementType;
use peregrine_types::{Dim, TensorDescription};
use peregrine_vision::Letterbox;

/// The description of the fake model.
pub fn description() -> ModelDescription {
    let t = |name: &str, dims| TensorDescription {
        name: name.into(),
        element: ElementType::F32,
        dims,
    };
    ModelDescription {
        inputs: vec![t(
            "images",
            vec![Dim::Dynamic, Dim::Fixed(3), Dim::Fixed(32), Dim::Fixed(32)],
        )],
        outputs: vec![t("output0", vec![Dim::Dynamic, Dim::Fixed(1), Dim::Fixed(6)])],
        metadata: [("end2end".to_string(), "True".to_string())].into(),
    }
}

/// Sleeps per batch and records the red value of every image it computed (warm-up's gray
/// images excluded), which identifies the requests.
pub struct SlowBackend {
    pub description: ModelDescription,
    pub delay: Duration,
    pub computed: Arc<Mutex<Vec<u8>>>,
    /// Fails every run with this message (a model that cannot warm up).
    pub fail: Option<String>,
    input: Vec<f32>,
}

impl SlowBackend {
    pub fn new(delay: Duration, computed: Arc<Mutex<Vec<u8>>>) -> Self {
        Self {
            description: description(),
            delay,
            computed,
            fail: None,
            input: Vec::new(),
        }
    }
}

impl Backend for SlowBackend {
    fn description(&self) -> &ModelDescription {
        &self.description
    }

    fn input(&mut self, shape: [usize; 4]) -> Result<InputBuffer<'_>, BackendError> {
        self.input.resize(shape.iter().product(), f32::NAN);
        Ok(InputBuffer::F32(&mut self.input))
    }

    fn run(&mut self, shape: [usize; 4], output: &mut OutputBuffer) -> Result<(), BackendError> {
        if let Some(why) = &self.fail {
            return Err(BackendError::Inference(why.clone()));
        }
        std::thread::sleep(self.delay);
        let n = shape[0];
        let plane = 32 * 32;
        output.shape = vec![n, 1, 6];
        output.data.clear();
        for i in 0..n {
            // The image's colour (first pixel of the red plane) identifies the request.
            let red = (self.input[i * 3 * plane] * 255.0).round() as u8;
            if red != Letterbox::PAD_VALUE {
                self.computed.lock().unwrap().push(red);
            }
            output
                .data
                .extend_from_slice(&[1.0, 1.0, 5.0, 5.0, 0.9, f32::from(red)]);
        }
        Ok(())
    }
}

/// A PNG of one colour, as a request would send it.
pub fn png(red: u8) -> bytes::Bytes {
    let img = image::RgbImage::from_pixel(32, 32, image::Rgb([red, 0, 0]));
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    bytes::Bytes::from(out.into_inner())
}
