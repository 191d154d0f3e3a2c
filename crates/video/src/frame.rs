//! Decoded pictures: packed RGB8 frames whose buffers come from a bounded per-stream pool.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

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

/// One decoded picture as packed RGB8 rows (`stride >= width * 3`). Its buffer goes back to
/// the stream's [`FramePool`] when the frame is dropped.
pub struct Frame {
    data: Vec<u8>,
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

    /// `height` rows of `stride` bytes; each row's first `width * 3` bytes are pixels.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    pub(crate) fn data_mut(&mut self) -> &mut [u8] {
        &mut self.data
    }
}

impl Drop for Frame {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.data));
    }
}

#[derive(Debug)]
struct PoolShared {
    /// Most frames alive at once (in the pool's free list or out in the pipeline).
    capacity: usize,
    outstanding: AtomicUsize,
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
                free: Mutex::new(Vec::new()),
            }),
        }
    }

    /// A frame of `width x height` (contents unspecified), or `None` when every buffer is
    /// out. Buffers of another size are resized, so a resolution change costs one
    /// reallocation per buffer.
    pub fn take(&self, width: u32, height: u32, meta: FrameMeta) -> Option<Frame> {
        let s = &self.shared;
        let mut current = s.outstanding.load(Ordering::Acquire);
        loop {
            if current >= s.capacity {
                return None;
            }
            match s
                .outstanding
                .compare_exchange(current, current + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(now) => current = now,
            }
        }
        let stride = (width as usize * 3).div_ceil(ROW_ALIGN) * ROW_ALIGN;
        let len = stride * height as usize;
        let mut data = s.free.lock().ok().and_then(|mut f| f.pop()).unwrap_or_default();
        data.resize(len, 0);
        Some(Frame {
            data,
            width,
            height,
            stride,
            meta,
            pool: s.clone(),
        })
    }

    /// Frames currently out of the pool.
    pub fn outstanding(&self) -> usize {
        self.shared.outstanding.load(Ordering::Acquire)
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
        assert_eq!(a.data().len(), 64 * 4);
        drop(a);
        assert_eq!(pool.outstanding(), 1);
        let c = pool.take(100, 2, test_meta(3)).unwrap();
        assert_eq!(c.stride(), 320);
        assert_eq!(c.data().len(), 640);
        drop((b, c));
        assert_eq!(pool.outstanding(), 0);
    }

    #[test]
    fn pts_converts_90k_ticks_to_seconds() {
        assert_eq!(Pts::from_90k(135_000).seconds, 1.5);
    }
}
