//! A fake model for the engine's tests: 32x32 inputs, an end-to-end output of one row per
//! image whose class is the image's red value, and a configurable delay per batch.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use peregrine_backend::{
    Backend, BackendError, DeviceSlots, FrameSlot, InputBuffer, ModelDescription, OutputBuffer,
};
use peregrine_types::model::ElementType;
use peregrine_types::{Dim, TensorDescription};
use peregrine_vision::yuv::Nv12Planes;
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

/// The fake model with the rewritten graph's input: a uint8 `[N, 32, 32, 3]` canvas.
fn canvas_description() -> ModelDescription {
    sized_canvas_description(32, 32)
}

/// A uint8 NHWC canvas input of `width` x `height`.
fn sized_canvas_description(width: usize, height: usize) -> ModelDescription {
    let mut description = description();
    description.inputs[0].element = ElementType::U8;
    description.inputs[0].dims = vec![Dim::Dynamic, Dim::Fixed(height), Dim::Fixed(width), Dim::Fixed(3)];
    description
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
        Self {
            description: canvas_description(),
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

    fn run_with_device_slots(
        &mut self,
        shape: [usize; 4],
        device: DeviceSlots<'_>,
        output: &mut OutputBuffer,
    ) -> Result<(), BackendError> {
        if !device.frames.is_empty() {
            return Err(BackendError::Inference("no frames here".into()));
        }
        let jpegs = device.jpegs;
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
                j.place.scaled,
                "the engine's geometry"
            );
            self.input[j.place.slot * slot..(j.place.slot + 1) * slot].copy_from_slice(&canvas);
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

/// A model with a uint8 canvas input that "takes frames on GPU `device`": each frame's
/// description holds host addresses, and it converts and letterboxes them with the GPU
/// kernels' arithmetic ([`letterbox_frame_on_host`]). The output's class is a checksum of
/// each slot's whole canvas, so two ways of making a canvas can be compared.
pub struct DeviceFrameBackend {
    description: ModelDescription,
    /// The canvas (width, height).
    canvas: (usize, usize),
    input: Vec<u8>,
    pub device: i32,
    /// Off: a plain canvas model that takes no frames on a device (the same outputs).
    pub takes_frames: bool,
    /// Frame slots the "device" letterboxed.
    pub frames_taken: Arc<Mutex<usize>>,
}

impl DeviceFrameBackend {
    /// With a 32x32 canvas.
    pub fn new(device: i32, frames_taken: Arc<Mutex<usize>>) -> Self {
        Self::with_canvas(device, frames_taken, (32, 32))
    }

    /// With a `canvas.0` x `canvas.1` canvas (width, height).
    pub fn with_canvas(device: i32, frames_taken: Arc<Mutex<usize>>, canvas: (usize, usize)) -> Self {
        Self {
            description: sized_canvas_description(canvas.0, canvas.1),
            canvas,
            input: Vec::new(),
            device,
            takes_frames: true,
            frames_taken,
        }
    }
}

/// FNV-1a over a canvas, kept within f32's exact integers.
pub fn canvas_checksum(canvas: &[u8]) -> u32 {
    let hash = canvas.iter().fold(0x811c_9dc5_u32, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    hash & 0xFF_FFFF
}

/// What the `nv12_to_rgb` and `letterbox_bilinear` kernels compute for `frame`, on the
/// host: `frame.image`'s addresses must be host memory holding its planes.
///
/// # Safety
/// The image's addresses and pitches must describe live host memory.
pub unsafe fn letterbox_frame_on_host(frame: &FrameSlot<'_>, canvas: &mut [u8], canvas_width: usize) {
    let image = frame.image;
    let (w, h) = (image.width, image.height);
    // SAFETY: as the caller vouches.
    let (y, uv) = unsafe {
        (
            std::slice::from_raw_parts(image.luma as *const u8, image.luma_pitch * h),
            std::slice::from_raw_parts(image.chroma as *const u8, image.chroma_pitch * h.div_ceil(2)),
        )
    };
    let mut rgb = vec![0u8; w * h * 3];
    let planes = Nv12Planes {
        y,
        y_stride: image.luma_pitch,
        uv,
        uv_stride: image.chroma_pitch,
    };
    image.conversion.convert_nv12(planes, w, h, &mut rgb, w * 3);
    let p = &frame.place;
    canvas.fill(p.pad_value);
    let (sw, sh) = p.scaled;
    for dy in 0..sh {
        for dx in 0..sw {
            let at = ((p.offset.1 + dy) * canvas_width + p.offset.0 + dx) * 3;
            for c in 0..3 {
                canvas[at + c] = if p.scaled == (w, h) {
                    rgb[(dy * w + dx) * 3 + c]
                } else {
                    let [r0, r1, v0, v1] = p.rows[dy];
                    let [t0, t1, w0, w1] = p.columns[dx];
                    let tap = |row: i32, t: i32| i32::from(rgb[row as usize * w * 3 + t as usize + c]);
                    let a = ((tap(r0, t0) * w0 + tap(r0, t1) * w1) >> 4) as i16;
                    let b = ((tap(r1, t0) * w0 + tap(r1, t1) * w1) >> 4) as i16;
                    let v = (((i32::from(a) * v0) >> 16) + ((i32::from(b) * v1) >> 16) + 2) >> 2;
                    v.clamp(0, 255) as u8
                };
            }
        }
    }
}

impl Backend for DeviceFrameBackend {
    fn description(&self) -> &ModelDescription {
        &self.description
    }

    fn input(&mut self, shape: [usize; 4]) -> Result<InputBuffer<'_>, BackendError> {
        self.input.resize(shape.iter().product(), 0);
        Ok(InputBuffer::U8(&mut self.input))
    }

    fn frames_device(&self) -> Option<i32> {
        self.takes_frames.then_some(self.device)
    }

    fn run_with_device_slots(
        &mut self,
        shape: [usize; 4],
        device: DeviceSlots<'_>,
        output: &mut OutputBuffer,
    ) -> Result<(), BackendError> {
        if !device.jpegs.is_empty() {
            return Err(BackendError::Inference("no JPEGs here".into()));
        }
        let slot = self.canvas.0 * self.canvas.1 * 3;
        for f in device.frames {
            let at = f.place.slot * slot;
            // SAFETY: the tests that send frames here describe host buffers they keep.
            unsafe { letterbox_frame_on_host(f, &mut self.input[at..at + slot], self.canvas.0) };
        }
        *self.frames_taken.lock().unwrap() += device.frames.len();
        self.run(shape, output)
    }

    fn run(&mut self, shape: [usize; 4], output: &mut OutputBuffer) -> Result<(), BackendError> {
        let n = shape[0];
        let slot = self.canvas.0 * self.canvas.1 * 3;
        output.shape = vec![n, 1, 6];
        output.data.clear();
        for i in 0..n {
            let sum = canvas_checksum(&self.input[i * slot..(i + 1) * slot]);
            output
                .data
                .extend_from_slice(&[1.0, 1.0, 5.0, 5.0, 0.9, sum as f32]);
        }
        Ok(())
    }
}
