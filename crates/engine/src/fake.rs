//! A fake model for the engine's tests: 32x32 inputs, an end-to-end output of one row per
//! image whose class is the image's red value, and a configurable delay per batch.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use peregrine_backend::{Backend, BackendError, InputBuffer, JpegSlot, ModelDescription, OutputBuffer};
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
    /// The GPU it claims to run on.
    pub device: Option<i32>,
    /// Once set, every run fails as a GPU whose context is corrupt does.
    pub broken: Option<Arc<std::sync::atomic::AtomicBool>>,
    input: Vec<f32>,
}

impl SlowBackend {
    pub fn new(delay: Duration, computed: Arc<Mutex<Vec<u8>>>) -> Self {
        Self {
            description: description(),
            delay,
            computed,
            fail: None,
            device: None,
            broken: None,
            input: Vec::new(),
        }
    }
}

impl Backend for SlowBackend {
    fn description(&self) -> &ModelDescription {
        &self.description
    }

    fn device(&self) -> Option<i32> {
        self.device
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
        if self
            .broken
            .as_ref()
            .is_some_and(|b| b.load(std::sync::atomic::Ordering::Relaxed))
        {
            // ONNX Runtime's words for it, through the same classification as a real run.
            let e = BackendError::Inference(
                "CUDA failure 700: an illegal memory access was encountered ; GPU=1".into(),
            );
            return Err(e.on_device(self.device));
        }
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

/// A JPEG of one colour, 64x48 (letterboxed to 32x24 in the 32x32 input).
pub fn jpeg(red: u8) -> bytes::Bytes {
    let img = image::RgbImage::from_pixel(64, 48, image::Rgb([red, 0, 0]));
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Jpeg).unwrap();
    bytes::Bytes::from(out.into_inner())
}

/// A JPEG whose header is whole but whose scan is cut short (the end marker kept): only a
/// real decode finds out.
pub fn broken_jpeg() -> bytes::Bytes {
    let good = jpeg(10);
    let sos = good.windows(2).position(|w| w == [0xFF, 0xDA]).unwrap();
    let mut cut = good[..sos + 20].to_vec();
    cut.extend_from_slice(&[0xFF, 0xD9]);
    bytes::Bytes::from(cut)
}

/// A model with a uint8 canvas input that "decodes JPEGs on the device" by decoding them
/// on the CPU into its own input buffer; the output's class is each slot's centre red value.
/// With `device_fails`, every batch holding a JPEG fails as a device decoder's would.
pub struct DeviceJpegBackend {
    description: ModelDescription,
    input: Vec<u8>,
    pub device_fails: bool,
    /// JPEG slots the "device" decoded.
    pub device_decoded: Arc<Mutex<usize>>,
}

impl DeviceJpegBackend {
    pub fn new(device_fails: bool, device_decoded: Arc<Mutex<usize>>) -> Self {
        let mut description = description();
        description.inputs[0].element = ElementType::U8;
        description.inputs[0].dims = vec![Dim::Dynamic, Dim::Fixed(32), Dim::Fixed(32), Dim::Fixed(3)];
        Self {
            description,
            input: Vec::new(),
            device_fails,
            device_decoded,
        }
    }
}

impl Backend for DeviceJpegBackend {
    fn description(&self) -> &ModelDescription {
        &self.description
    }

    fn input(&mut self, shape: [usize; 4]) -> Result<InputBuffer<'_>, BackendError> {
        self.input.resize(shape.iter().product(), 0);
        Ok(InputBuffer::U8(&mut self.input))
    }

    fn decodes_jpeg(&self) -> bool {
        true
    }

    fn run_with_jpegs(
        &mut self,
        shape: [usize; 4],
        jpegs: &[JpegSlot<'_>],
        output: &mut OutputBuffer,
    ) -> Result<(), BackendError> {
        if self.device_fails && !jpegs.is_empty() {
            return Err(BackendError::DeviceDecode("nvjpegDecodeBatched: bad JPEG".into()));
        }
        let slot = 32 * 32 * 3;
        for j in jpegs {
            let img = peregrine_vision::decode_image(j.data, Default::default())
                .map_err(|e| BackendError::DeviceDecode(e.to_string()))?;
            let mut canvas = Vec::new();
            let lb = peregrine_vision::LetterboxCanvas::new().fill_into(
                peregrine_vision::ImageView::from(&img.rgb),
                32,
                32,
                &mut canvas,
            );
            assert_eq!(
                (lb.scaled_width, lb.scaled_height),
                j.scaled,
                "the engine's geometry"
            );
            self.input[j.slot * slot..(j.slot + 1) * slot].copy_from_slice(&canvas);
        }
        *self.device_decoded.lock().unwrap() += jpegs.len();
        self.run(shape, output)
    }

    fn run(&mut self, shape: [usize; 4], output: &mut OutputBuffer) -> Result<(), BackendError> {
        let n = shape[0];
        output.shape = vec![n, 1, 6];
        output.data.clear();
        for i in 0..n {
            // The centre pixel's red value (the letterbox pads above and below).
            let centre = i * 32 * 32 * 3 + (16 * 32 + 16) * 3;
            let red = self.input[centre];
            output
                .data
                .extend_from_slice(&[1.0, 1.0, 5.0, 5.0, 0.9, f32::from(red)]);
        }
        Ok(())
    }
}
