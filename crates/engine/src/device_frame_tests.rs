//! Video frames in GPU memory: taken by an engine whose instances letterbox frames on that
//! GPU (a fake that does the kernels' arithmetic on host memory), refused by others.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use peregrine_vision::yuv::{Nv12Image, Nv12Planes, YuvToRgb};

use super::{fake_config, far};
use crate::fake::{DeviceFrameBackend, SlowBackend};
use crate::{Detector, DetectorConfig, Engine, EngineError, FrameOwner, RequestError};

/// An NV12 picture in host memory, standing in for an NVDEC surface.
struct HostNv12 {
    width: usize,
    height: usize,
    pitch: usize,
    luma: Vec<u8>,
    chroma: Vec<u8>,
}

impl HostNv12 {
    fn noise(width: usize, height: usize) -> Self {
        let pitch = width.div_ceil(64) * 64;
        let mut state = 0x2545_f491_u32;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            (state >> 24) as u8
        };
        let luma = (0..pitch * height).map(|_| next()).collect();
        let chroma = (0..pitch * height.div_ceil(2)).map(|_| next()).collect();
        Self {
            width,
            height,
            pitch,
            luma,
            chroma,
        }
    }

    fn image(&self, device: i32) -> Nv12Image {
        Nv12Image {
            device,
            width: self.width,
            height: self.height,
            luma: self.luma.as_ptr() as u64,
            luma_pitch: self.pitch,
            chroma: self.chroma.as_ptr() as u64,
            chroma_pitch: self.pitch,
            conversion: YuvToRgb::new(1, false).unwrap(),
        }
    }

    /// The picture as the CPU path has it: packed RGB rows.
    fn rgb(&self) -> Vec<u8> {
        let planes = Nv12Planes {
            y: &self.luma,
            y_stride: self.pitch,
            uv: &self.chroma,
            uv_stride: self.pitch,
        };
        let mut rgb = vec![0; self.width * self.height * 3];
        let conversion = YuvToRgb::new(1, false).unwrap();
        conversion.convert_nv12(planes, self.width, self.height, &mut rgb, self.width * 3);
        rgb
    }
}

fn start_frames(device: Option<i32>) -> (Engine, Arc<Mutex<usize>>) {
    start_frames_on(device, (32, 32))
}

/// An engine whose model's canvas is `canvas` (width, height).
fn start_frames_on(device: Option<i32>, canvas: (usize, usize)) -> (Engine, Arc<Mutex<usize>>) {
    let taken = Arc::new(Mutex::new(0));
    let t = taken.clone();
    let factory = move |_instance: usize| -> Result<Detector, EngineError> {
        let config = DetectorConfig {
            imgsz: None,
            max_batch: 4,
            run_sizes: vec![],
        };
        match device {
            Some(d) => Detector::new(
                Box::new(DeviceFrameBackend::with_canvas(d, t.clone(), canvas)),
                &config,
            ),
            None => Detector::new(
                Box::new(SlowBackend::new(Duration::ZERO, Arc::default())),
                &config,
            ),
        }
    };
    (Engine::start(fake_config(2, 4, false), factory).unwrap(), taken)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_on_the_gpu_gets_the_canvas_the_host_path_makes() {
    canvases_match_on((32, 32)).await;
}

/// A wide canvas (as `imgsz = [384, 640]` gives 16:9 cameras): the placement and the
/// rows' stride follow the canvas's own width and height.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_on_the_gpu_gets_the_host_canvas_on_a_wide_canvas_too() {
    canvases_match_on((40, 24)).await;
}

async fn canvases_match_on(canvas: (usize, usize)) {
    let (engine, taken) = start_frames_on(Some(0), canvas);
    engine.wait_ready().await.unwrap();
    assert_eq!(engine.frames_device(), Some(0));
    // Landscape, portrait, upscaled and odd-width pictures all take the letterbox's path.
    for (w, h) in [(64, 36), (30, 50), (12, 8), (45, 20)] {
        let picture = Arc::new(HostNv12::noise(w, h));
        let permit = engine.try_admit().unwrap();
        let owner = FrameOwner(picture.clone());
        let on_gpu = engine
            .detect_device_frame(&permit, picture.image(0), owner, Default::default(), far())
            .await
            .unwrap();
        let rgb = picture.rgb();
        let on_host = engine
            .detect_frame(&permit, rgb, w, h, w * 3, Default::default(), far())
            .await
            .unwrap();
        assert_eq!((on_gpu.width, on_gpu.height), (w as u32, h as u32));
        assert_eq!(
            on_gpu.detections[0].class_id, on_host.detections[0].class_id,
            "{w}x{h}: the canvases' checksums"
        );
        assert_eq!(
            Arc::strong_count(&picture),
            1,
            "the frame is let go once answered"
        );
    }
    assert_eq!(*taken.lock().unwrap(), 4, "every frame went to the device path");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_on_another_gpu_or_without_one_are_refused_for_the_host_path() {
    let picture = Arc::new(HostNv12::noise(16, 16));
    let (engine, taken) = start_frames(Some(0));
    engine.wait_ready().await.unwrap();
    let permit = engine.try_admit().unwrap();
    let owner = FrameOwner(picture.clone());
    match engine
        .detect_device_frame(&permit, picture.image(1), owner, Default::default(), far())
        .await
    {
        Err(RequestError::FrameNotTaken(why)) => assert!(why.contains("takes frames on GPU 0 only"), "{why}"),
        other => panic!("a frame on GPU 1: {other:?}"),
    }
    let mut no_planes = picture.image(0);
    no_planes.chroma = 0;
    let owner = FrameOwner(picture.clone());
    match engine
        .detect_device_frame(&permit, no_planes, owner, Default::default(), far())
        .await
    {
        Err(RequestError::FrameNotTaken(why)) => assert!(why.contains("no address"), "{why}"),
        other => panic!("a frame without chroma: {other:?}"),
    }
    assert_eq!(*taken.lock().unwrap(), 0);

    let (cpu, _) = start_frames(None);
    cpu.wait_ready().await.unwrap();
    assert_eq!(cpu.frames_device(), None);
    let permit = cpu.try_admit().unwrap();
    let owner = FrameOwner(picture.clone());
    match cpu
        .detect_device_frame(&permit, picture.image(0), owner, Default::default(), far())
        .await
    {
        Err(RequestError::FrameNotTaken(why)) => {
            assert!(why.contains("takes no frames in GPU memory"), "{why}")
        }
        other => panic!("an engine without frames: {other:?}"),
    }
    assert_eq!(Arc::strong_count(&picture), 1);
}
