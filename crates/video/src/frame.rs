//! Decoded pictures: packed RGB8 frames whose buffers come from a bounded per-stream pool,
//! or pictures left in GPU memory by NVDEC ([`DeviceSurface`]), counted in the same pool.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

use peregrine_vision::yuv::Nv12Image;

use tokio::time::Instant;

/// Rows are padded to this many bytes so swscale's SIMD writers take their aligned path.
pub const ROW_ALIGN: usize = 64;

/// A stream's presentation time: the raw 90 kHz value and the same as seconds from the
/// stream's start. File sources are rescaled to 90 kHz so both kinds of source read alike.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pts {
    pub ticks_90k: i64,
    pub seconds: f64,
}

impl Pts {
    pub const CLOCK_HZ: i64 = 90_000;

    pub fn from_90k(ticks_90k: i64) -> Self {
        Self {
            ticks_90k,
            seconds: ticks_90k as f64 / Self::CLOCK_HZ as f64,
        }
    }
}

/// Where a frame's wall-clock capture time came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockSource {
    /// The camera's RTCP sender reports map its RTP clock to NTP wall-clock time.
    RtcpSenderReport,
    /// No sender report yet (or a file): the time this machine received the frame.
    LocalReceive,
    /// A pushed RTP stream (GB28181): the frame's RTP timestamp, counted from the time this
    /// machine received the stream's first packet.
    RtpArrival,
}

impl ClockSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RtcpSenderReport => "rtcp",
            Self::LocalReceive => "local",
            Self::RtpArrival => "rtp",
        }
    }
}

/// When a frame was captured, by the best clock available for it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CaptureTime {
    pub wall: SystemTime,
    pub source: ClockSource,
    /// When this machine received the frame's data (monotonic). Staleness is measured from
    /// here rather than from `wall`, since a camera's clock may be off by any amount.
    pub received: Instant,
}

/// What is known about a frame besides its pixels.
#[derive(Debug, Clone)]
pub struct FrameMeta {
    pub stream: Arc<str>,
    /// Frames decoded on this stream before this one (across reconnects).
    pub seq: u64,
    pub pts: Pts,
    pub capture: CaptureTime,
}

/// A decoded picture left in GPU memory (an NVDEC surface), kept there while this lives.
pub trait DeviceSurface: Send + Sync + 'static {
    /// The picture as the engine's kernels read it.
    fn image(&self) -> Nv12Image;

    /// Copies the picture to the host as packed RGB8 rows of `stride` bytes, converted as
    /// CPU decoding converts it.
    fn download_rgb(&self, out: &mut [u8], stride: usize) -> Result<(), String>;
}

/// A frame's picture in GPU memory, and its host copy once someone asked for the pixels.
struct OnDevice {
    surface: Arc<dyn DeviceSurface>,
    host: OnceLock<Result<Vec<u8>, String>>,
}

/// One decoded picture as packed RGB8 rows (`stride >= width * 3`), or in GPU memory. Its
/// buffer (or its place in the pool) goes back to the stream's [`FramePool`] when the frame
/// is dropped.
pub struct Frame {
    data: Vec<u8>,
    /// Set for a picture left in GPU memory; `data` is then empty.
    device: Option<OnDevice>,
    width: u32,
    height: u32,
    stride: usize,
    pub meta: FrameMeta,
    pool: Arc<PoolShared>,
}

impl std::fmt::Debug for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frame")
            .field("width", &self.width)
            .field("height", &self.height)
            .field("stride", &self.stride)
            .field("meta", &self.meta)
            .finish()
    }
}

impl Frame {
    pub fn width(&self) -> u32 {
        self.width
    }

    pub fn height(&self) -> u32 {
        self.height
    }

    /// Bytes from one row to the next.
    pub fn stride(&self) -> usize {
        self.stride
    }

    /// `height` rows of `stride` bytes; each row's first `width * 3` bytes are pixels. A
    /// frame in GPU memory is copied down (and converted) the first time this is asked,
    /// and the error says why when that fails.
    pub fn pixels(&self) -> Result<&[u8], String> {
        let Some(device) = &self.device else {
            return Ok(&self.data);
        };
        device
            .host
            .get_or_init(|| {
                let mut rgb = vec![0; self.stride * self.height as usize];
                device.surface.download_rgb(&mut rgb, self.stride).map(|()| rgb)
            })
            .as_deref()
            .map_err(Clone::clone)
    }

    /// The picture in GPU memory, for a frame that is there.
    pub fn device_surface(&self) -> Option<&Arc<dyn DeviceSurface>> {
        self.device.as_ref().map(|d| &d.surface)
    }

    pub(crate) fn data_mut(&mut self) -> &mut [u8] {
        &mut self.data
    }
}

impl Drop for Frame {
    fn drop(&mut self) {
        if self.device.take().is_some() {
            self.pool.on_device.fetch_sub(1, Ordering::AcqRel);
            self.pool.outstanding.fetch_sub(1, Ordering::AcqRel);
        } else {
            self.pool.give_back(std::mem::take(&mut self.data));
        }
    }
}

#[derive(Debug)]
struct PoolShared {
    /// Most frames alive at once (in the pool's free list or out in the pipeline).
    capacity: usize,
    outstanding: AtomicUsize,
    /// Of the outstanding frames, those in GPU memory.
    on_device: AtomicUsize,
    free: Mutex<Vec<Vec<u8>>>,
}

impl PoolShared {
    fn give_back(&self, buf: Vec<u8>) {
        self.outstanding.fetch_sub(1, Ordering::AcqRel);
        if let Ok(mut free) = self.free.lock() {
            // The free list never exceeds the capacity, since only taken buffers return.
            free.push(buf);
        }
    }
}

/// A bounded set of frame buffers for one stream. At most `capacity` frames exist at once;
/// asking for another while all are out fails (the caller drops the picture and counts
/// it), so a stalled consumer can never make a stream allocate without bound.
#[derive(Debug, Clone)]
pub struct FramePool {
    shared: Arc<PoolShared>,
}

impl FramePool {
    pub fn new(capacity: usize) -> Self {
        Self {
            shared: Arc::new(PoolShared {
                capacity: capacity.max(1),
                outstanding: AtomicUsize::new(0),
                on_device: AtomicUsize::new(0),
                free: Mutex::new(Vec::new()),
            }),
        }
    }

    /// A frame of `width x height` (contents unspecified), or `None` when every buffer is
    /// out. Buffers of another size are resized, so a resolution change costs one
    /// reallocation per buffer.
    pub fn take(&self, width: u32, height: u32, meta: FrameMeta) -> Option<Frame> {
        let s = &self.shared;
        if !self.reserve() {
            return None;
        }
        let stride = (width as usize * 3).div_ceil(ROW_ALIGN) * ROW_ALIGN;
        let len = stride * height as usize;
        let mut data = s.free.lock().ok().and_then(|mut f| f.pop()).unwrap_or_default();
        data.resize(len, 0);
        Some(Frame {
            data,
            device: None,
            width,
            height,
            stride,
            meta,
            pool: s.clone(),
        })
    }

    /// A frame of `surface`'s picture, left in GPU memory, or `None` when every place in
    /// the pool is taken: it counts against the same capacity as host frames (and so
    /// bounds the surfaces a stream holds), though it takes no host buffer.
    pub fn take_on_device(&self, surface: Arc<dyn DeviceSurface>, meta: FrameMeta) -> Option<Frame> {
        if !self.reserve() {
            return None;
        }
        self.shared.on_device.fetch_add(1, Ordering::AcqRel);
        let image = surface.image();
        let width = image.width as u32;
        Some(Frame {
            data: Vec::new(),
            device: Some(OnDevice {
                surface,
                host: OnceLock::new(),
            }),
            width,
            height: image.height as u32,
            stride: (image.width * 3).div_ceil(ROW_ALIGN) * ROW_ALIGN,
            meta,
            pool: self.shared.clone(),
        })
    }

    /// Takes one place in the pool, if one is free.
    fn reserve(&self) -> bool {
        let s = &self.shared;
        let mut current = s.outstanding.load(Ordering::Acquire);
        loop {
            if current >= s.capacity {
                return false;
            }
            match s
                .outstanding
                .compare_exchange(current, current + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(now) => current = now,
            }
        }
    }

    /// Frames currently out of the pool.
    pub fn outstanding(&self) -> usize {
        self.shared.outstanding.load(Ordering::Acquire)
    }

    /// Of those, the frames in GPU memory.
    pub fn on_device(&self) -> usize {
        self.shared.on_device.load(Ordering::Acquire)
    }

    /// Most frames out at once.
    pub fn capacity(&self) -> usize {
        self.shared.capacity
    }
}

#[cfg(test)]
pub(crate) fn test_meta(seq: u64) -> FrameMeta {
    FrameMeta {
        stream: "test".into(),
        seq,
        pts: Pts::from_90k(seq as i64 * 3600),
        capture: CaptureTime {
            wall: SystemTime::now(),
            source: ClockSource::LocalReceive,
            received: Instant::now(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_is_bounded_and_buffers_return_on_drop() {
        let pool = FramePool::new(2);
        let a = pool.take(10, 4, test_meta(0)).unwrap();
        let b = pool.take(10, 4, test_meta(1)).unwrap();
        assert!(
            pool.take(10, 4, test_meta(2)).is_none(),
            "third frame over capacity"
        );
        assert_eq!(a.stride(), 64, "30 bytes of pixels padded to one 64-byte row");
        assert_eq!(a.pixels().unwrap().len(), 64 * 4);
        drop(a);
        assert_eq!(pool.outstanding(), 1);
        let c = pool.take(100, 2, test_meta(3)).unwrap();
        assert_eq!(c.stride(), 320);
        assert_eq!(c.pixels().unwrap().len(), 640);
        drop((b, c));
        assert_eq!(pool.outstanding(), 0);
    }

    /// A picture "in GPU memory" that counts its downloads, fills them with one value, or
    /// fails them.
    struct FakeSurface {
        width: usize,
        height: usize,
        fill: Result<u8, String>,
        downloads: AtomicUsize,
    }

    impl DeviceSurface for FakeSurface {
        fn image(&self) -> Nv12Image {
            Nv12Image {
                device: 0,
                width: self.width,
                height: self.height,
                luma: 1,
                luma_pitch: self.width,
                chroma: 2,
                chroma_pitch: self.width,
                conversion: peregrine_vision::yuv::YuvToRgb::new(1, false).unwrap(),
            }
        }

        fn download_rgb(&self, out: &mut [u8], stride: usize) -> Result<(), String> {
            self.downloads.fetch_add(1, Ordering::Relaxed);
            assert!(stride >= self.width * 3 && out.len() >= stride * self.height);
            out.fill(*self.fill.as_ref()?);
            Ok(())
        }
    }

    fn surface(fill: Result<u8, String>) -> Arc<FakeSurface> {
        Arc::new(FakeSurface {
            width: 30,
            height: 4,
            fill,
            downloads: AtomicUsize::new(0),
        })
    }

    #[test]
    fn frames_on_the_gpu_share_the_pools_capacity_and_release_their_surfaces() {
        let pool = FramePool::new(2);
        let s = surface(Ok(7));
        let on_gpu = pool.take_on_device(s.clone(), test_meta(0)).unwrap();
        assert_eq!((on_gpu.width(), on_gpu.height(), on_gpu.stride()), (30, 4, 128));
        let host = pool.take(30, 4, test_meta(1)).unwrap();
        assert_eq!((pool.outstanding(), pool.on_device()), (2, 1));
        assert!(
            pool.take_on_device(s.clone(), test_meta(2)).is_none(),
            "over capacity"
        );
        assert!(pool.take(30, 4, test_meta(3)).is_none(), "over capacity");
        assert!(on_gpu.device_surface().is_some() && host.device_surface().is_none());
        drop(on_gpu);
        assert_eq!((pool.outstanding(), pool.on_device()), (1, 0));
        assert_eq!(Arc::strong_count(&s), 1, "the surface is let go with its frame");
        drop(host);
        assert_eq!(pool.outstanding(), 0);
    }

    #[test]
    fn a_gpu_frames_pixels_are_downloaded_once_when_asked() {
        let pool = FramePool::new(2);
        let s = surface(Ok(9));
        let frame = pool.take_on_device(s.clone(), test_meta(0)).unwrap();
        assert_eq!(
            s.downloads.load(Ordering::Relaxed),
            0,
            "nothing is copied until asked"
        );
        let pixels = frame.pixels().unwrap();
        assert_eq!(pixels.len(), 128 * 4);
        assert!(pixels.iter().all(|&b| b == 9));
        frame.pixels().unwrap();
        assert_eq!(s.downloads.load(Ordering::Relaxed), 1);
        let failing = pool
            .take_on_device(surface(Err("the GPU is gone".into())), test_meta(1))
            .unwrap();
        assert_eq!(failing.pixels().unwrap_err(), "the GPU is gone");
    }

    #[test]
    fn pts_converts_90k_ticks_to_seconds() {
        assert_eq!(Pts::from_90k(135_000).seconds, 1.5);
    }
}
