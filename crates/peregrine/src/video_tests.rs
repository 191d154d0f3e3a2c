//! Where a stream's frame goes: engines over the engine crate's fake devices, frames "on a
//! GPU" whose planes are host memory (the fake device reads them there).

use std::sync::atomic::AtomicUsize;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use peregrine_engine::fake::DeviceFrameBackend;
use peregrine_engine::{BatchPolicy, Detector, DetectorConfig, EngineConfig};
use peregrine_video::{CaptureTime, ClockSource, FrameMeta, FramePool, Pts};
use peregrine_vision::yuv::{Nv12Image, Nv12Planes, YuvToRgb};

use super::*;
use peregrine_video::DeviceSurface;

/// A 48x32 NV12 picture of noise in host memory, standing in for an NVDEC surface.
struct HostSurface {
    luma: Vec<u8>,
    chroma: Vec<u8>,
    device: i32,
    fail_download: bool,
    downloads: AtomicUsize,
}

const W: usize = 48;
const H: usize = 32;

impl HostSurface {
    fn new(device: i32, fail_download: bool) -> Self {
        let noise = |n: usize, mut s: u32| -> Vec<u8> {
            (0..n)
                .map(|_| {
                    s = s.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                    (s >> 16) as u8
                })
                .collect()
        };
        Self {
            luma: noise(W * H, 7),
            chroma: noise(W * H / 2, 11),
            device,
            fail_download,
            downloads: AtomicUsize::new(0),
        }
    }
}

impl DeviceSurface for HostSurface {
    fn image(&self) -> Nv12Image {
        Nv12Image {
            device: self.device,
            width: W,
            height: H,
            luma: self.luma.as_ptr() as u64,
            luma_pitch: W,
            chroma: self.chroma.as_ptr() as u64,
            chroma_pitch: W,
            conversion: YuvToRgb::new(1, false).unwrap(),
        }
    }

    fn download_rgb(&self, out: &mut [u8], stride: usize) -> Result<(), String> {
        self.downloads.fetch_add(1, Ordering::Relaxed);
        if self.fail_download {
            return Err("the device fell off the bus".into());
        }
        let planes = Nv12Planes {
            y: &self.luma,
            y_stride: W,
            uv: &self.chroma,
            uv_stride: W,
        };
        YuvToRgb::new(1, false)
            .unwrap()
            .convert_nv12(planes, W, H, out, stride);
        Ok(())
    }
}

fn meta() -> FrameMeta {
    FrameMeta {
        stream: "cam".into(),
        seq: 0,
        pts: Pts::from_90k(0),
        capture: CaptureTime {
            wall: SystemTime::now(),
            source: ClockSource::LocalReceive,
            received: tokio::time::Instant::now(),
        },
    }
}

/// An engine whose one instance takes frames on GPU `device` (or none, `None`).
async fn engine(frames_on: Option<i32>, taken: Arc<Mutex<usize>>) -> Engine {
    let factory = move |_: usize| {
        let config = DetectorConfig {
            imgsz: None,
            max_batch: 2,
            run_sizes: vec![],
        };
        let mut backend = DeviceFrameBackend::new(frames_on.unwrap_or(0), taken.clone());
        backend.takes_frames = frames_on.is_some();
        Detector::new(Box::new(backend), &config)
    };
    let config = EngineConfig {
        name: "fake".into(),
        policy: BatchPolicy {
            max_batch: 2,
            max_delay: Duration::ZERO,
            preferred: vec![],
            capacity: 8,
        },
        max_in_flight: 8,
        preprocess_threads: 1,
        ..EngineConfig::default()
    };
    let engine = Engine::start(config, factory).unwrap();
    engine.wait_ready().await.unwrap();
    engine
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_frames_go_to_an_engine_on_their_gpu_and_are_copied_down_for_others() {
    let pool = FramePool::new(4);
    let taken = Arc::new(Mutex::new(0));
    let on_gpu0 = engine(Some(0), taken.clone()).await;
    let surface = Arc::new(HostSurface::new(0, false));
    let frame = Arc::new(pool.take_on_device(surface.clone(), meta()).unwrap());
    let direct = detect_on(on_gpu0.clone(), frame.clone(), deadline())
        .await
        .unwrap();
    assert_eq!(*taken.lock().unwrap(), 1, "letterboxed by the device");
    assert_eq!(surface.downloads.load(Ordering::Relaxed), 0, "never copied down");

    // The same picture on GPU 1 is copied down for the engine on GPU 0, and gives the same
    // canvas, so the same detections.
    let elsewhere = Arc::new(HostSurface::new(1, false));
    let frame1 = Arc::new(pool.take_on_device(elsewhere.clone(), meta()).unwrap());
    let copied = detect_on(on_gpu0.clone(), frame1, deadline()).await.unwrap();
    assert_eq!(elsewhere.downloads.load(Ordering::Relaxed), 1);
    assert_eq!(*taken.lock().unwrap(), 1, "not by the device this time");
    assert_eq!(direct, copied);

    // An engine that takes no GPU frames at all: copied down too.
    let host_only = engine(None, Arc::default()).await;
    let again = detect_on(host_only, frame, deadline()).await.unwrap();
    assert_eq!(surface.downloads.load(Ordering::Relaxed), 1);
    assert_eq!(direct, again);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_that_cannot_be_copied_down_fails_with_the_reason() {
    let pool = FramePool::new(2);
    let host_only = engine(None, Arc::default()).await;
    let broken = Arc::new(HostSurface::new(0, true));
    let frame = Arc::new(pool.take_on_device(broken, meta()).unwrap());
    match detect_on(host_only, frame, deadline()).await {
        Err(DetectError::Failed(why)) => {
            assert!(
                why.contains("copying the frame from the GPU: the device fell off the bus"),
                "{why}"
            )
        }
        other => panic!("{other:?}"),
    }
}
