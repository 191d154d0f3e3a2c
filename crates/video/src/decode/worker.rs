//! One OS thread per stream runs its decoder, so decoding never blocks a tokio worker. The
//! thread decodes every access unit (inter frames need their references), converts to RGB
//! only the frames the sampler keeps, and puts each into the stream's latest-frame slot.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use peregrine_types::WallClock;
use tokio::sync::mpsc::{self, error::TrySendError, Receiver, Sender};

use tokio::time::Instant;

use super::hardware::{ActiveDecoder, DecodePlan, DecoderStatusCell};
use super::nvdec::FormatOutcome;
use super::{DecodeError, DecodedPicture, DecoderConfig, Hardware, VideoDecoder};
use crate::frame::{CaptureTime, ClockSource, DeviceSurface, Frame, FrameMeta, FramePool, Pts};
use crate::latest::LatestSlot;
use crate::sampling::FrameSampler;
use crate::source::{EncodedFrame, SourceError};
use crate::telemetry::{DropReason, StreamCounters};

static LIVE_DECODE_THREADS: AtomicUsize = AtomicUsize::new(0);

/// Decode threads running in this process (tests check that removed streams end theirs).
pub fn live_decode_threads() -> usize {
    LIVE_DECODE_THREADS.load(Ordering::Acquire)
}

/// Timestamps of access units waiting for their pictures (the decoder holds a few for
/// reordering and frame threading); more than this means pictures were lost, and the
/// oldest entries are forgotten.
const MAX_PENDING_TIMESTAMPS: usize = 128;

/// Messages to a decode thread.
#[derive(Debug)]
pub enum DecodeInput {
    /// (Re)open the decoder: a new connection or new stream parameters. `epoch` numbers
    /// the opens, so the source side can tell pictures of this decoder from older ones.
    Open {
        config: DecoderConfig,
        epoch: u64,
    },
    Frame(EncodedFrame),
}

#[derive(Debug, Clone)]
pub struct DecodeWorkerConfig {
    pub stream: Arc<str>,
    /// Target rate of frames handed to detection; `None` for every frame.
    pub fps: Option<f64>,
    /// Access units queued for the thread. When full, a live source's task does not wait:
    /// it drops access units up to the next key frame (counted as `decoder_behind`),
    /// because a live camera does not slow down for us and inter frames are useless
    /// without the frames before them. A source read as fast as possible waits instead.
    pub queue: usize,
    pub pool: FramePool,
    /// Stamps pictures whose access unit's capture time was lost.
    pub clock: Arc<dyn WallClock>,
    /// CPU or NVDEC ([`crate::DecoderDefaults::plan`]).
    pub plan: DecodePlan,
    /// Where the thread says what decodes (the stream's status reads it).
    pub status: DecoderStatusCell,
    /// Leave NVDEC's pictures in GPU memory for a model that takes them there
    /// ([`crate::DecoderDefaults::keeps_frames_on_gpu`]) instead of converting them here.
    pub gpu_frames: bool,
}

/// The source side's handle to a stream's decode thread.
#[derive(Debug)]
pub struct DecodeWorker {
    tx: Option<Sender<DecodeInput>>,
    thread: Option<std::thread::JoinHandle<()>>,
    skipping_to_key: bool,
    counters: Arc<StreamCounters>,
    /// Opens asked for so far.
    epoch: u64,
    /// The epoch of the decoder that produced the latest picture (0: none yet).
    picture_epoch: Arc<AtomicU64>,
}

impl DecodeWorker {
    /// Starts the thread. It closes `slot` when it ends, which ends the stream's detection.
    pub fn spawn(
        config: DecodeWorkerConfig,
        slot: Arc<LatestSlot<Frame>>,
        counters: Arc<StreamCounters>,
    ) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel(config.queue.max(1));
        let thread_counters = counters.clone();
        let picture_epoch = Arc::new(AtomicU64::new(0));
        let thread_picture_epoch = picture_epoch.clone();
        LIVE_DECODE_THREADS.fetch_add(1, Ordering::AcqRel);
        let spawned = std::thread::Builder::new()
            .name(format!("decode-{}", config.stream))
            .spawn(move || {
                let mut thread = DecodeThread::new(config, slot, thread_counters, thread_picture_epoch);
                thread.run(rx);
                thread.slot.close();
                LIVE_DECODE_THREADS.fetch_sub(1, Ordering::AcqRel);
            });
        let thread = match spawned {
            Ok(t) => t,
            Err(e) => {
                LIVE_DECODE_THREADS.fetch_sub(1, Ordering::AcqRel);
                return Err(e);
            }
        };
        Ok(Self {
            tx: Some(tx),
            thread: Some(thread),
            skipping_to_key: false,
            counters,
            epoch: 0,
            picture_epoch,
        })
    }

    /// Asks for the decoder to be (re)opened. Waits for room, as the command must not be
    /// lost; the thread drains its queue quickly.
    pub async fn open(&mut self, config: DecoderConfig) -> Result<(), SourceError> {
        let tx = self.tx.as_ref().ok_or(SourceError::DecoderGone)?;
        let epoch = self.epoch + 1;
        tx.send(DecodeInput::Open { config, epoch })
            .await
            .map_err(|_| SourceError::DecoderGone)?;
        self.epoch = epoch;
        // A new decoder must start on a key frame.
        self.skipping_to_key = true;
        Ok(())
    }

    /// Hands over an access unit, waiting for room: for sources that go as fast as the
    /// decoder does.
    pub async fn push_waiting(&mut self, frame: EncodedFrame) -> Result<(), SourceError> {
        if self.skipping_to_key && !frame.is_key {
            self.counters.dropped(DropReason::DecoderBehind);
            return Ok(());
        }
        let tx = self.tx.as_ref().ok_or(SourceError::DecoderGone)?;
        tx.send(DecodeInput::Frame(frame))
            .await
            .map_err(|_| SourceError::DecoderGone)?;
        self.skipping_to_key = false;
        Ok(())
    }

    /// Hands over an access unit without waiting (see [`DecodeWorkerConfig::queue`]).
    pub fn push(&mut self, frame: EncodedFrame) -> Result<(), SourceError> {
        if self.skipping_to_key && !frame.is_key {
            self.counters.dropped(DropReason::DecoderBehind);
            return Ok(());
        }
        let tx = self.tx.as_ref().ok_or(SourceError::DecoderGone)?;
        match tx.try_send(DecodeInput::Frame(frame)) {
            Ok(()) => {
                self.skipping_to_key = false;
                Ok(())
            }
            Err(TrySendError::Full(_)) => {
                self.counters.dropped(DropReason::DecoderBehind);
                self.skipping_to_key = true;
                Ok(())
            }
            Err(TrySendError::Closed(_)) => Err(SourceError::DecoderGone),
        }
    }

    /// Opens asked for so far; grows with every [`Self::open`].
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether the decoder of the latest [`Self::open`] has produced a picture: the
    /// connection that opened it works. Pictures from the frames of earlier connections,
    /// still queued, do not count.
    pub fn decoded_since_open(&self) -> bool {
        self.epoch > 0 && self.picture_epoch.load(Ordering::Acquire) == self.epoch
    }

    /// What [`Self::decoded_since_open`] reads: the epoch of the latest picture's decoder.
    #[cfg(test)]
    pub(crate) fn picture_epoch(&self) -> Arc<AtomicU64> {
        self.picture_epoch.clone()
    }

    /// Closes the input and waits (on the blocking pool) for the thread to finish.
    pub async fn shut_down(mut self) {
        self.tx = None;
        if let Some(thread) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}

struct DecodeThread {
    config: DecodeWorkerConfig,
    slot: Arc<LatestSlot<Frame>>,
    counters: Arc<StreamCounters>,
    sampler: FrameSampler,
    decoder: Option<VideoDecoder>,
    pending: BTreeMap<i64, CaptureTime>,
    next_seq: u64,
    /// The epoch of the open that made `decoder`.
    decoder_epoch: u64,
    picture_epoch: Arc<AtomicU64>,
    /// An NVDEC decoder whose acceptance of the stream is not known yet.
    hardware_pending: bool,
}

impl DecodeThread {
    fn new(
        config: DecodeWorkerConfig,
        slot: Arc<LatestSlot<Frame>>,
        counters: Arc<StreamCounters>,
        picture_epoch: Arc<AtomicU64>,
    ) -> Self {
        Self {
            sampler: FrameSampler::new(config.fps),
            config,
            slot,
            counters,
            decoder: None,
            pending: BTreeMap::new(),
            next_seq: 0,
            decoder_epoch: 0,
            picture_epoch,
            hardware_pending: false,
        }
    }

    fn run(&mut self, mut rx: Receiver<DecodeInput>) {
        while let Some(input) = rx.blocking_recv() {
            match input {
                DecodeInput::Open { config, epoch } => {
                    self.decoder_epoch = epoch;
                    self.open(&config);
                }
                DecodeInput::Frame(frame) => self.decode(frame),
            }
        }
    }

    fn open(&mut self, config: &DecoderConfig) {
        // The previous connection's pictures still in the old decoder are stale: drop them.
        self.decoder = None;
        self.pending.clear();
        self.hardware_pending = false;
        let (hardware, cpu_reason) = match &self.config.plan {
            DecodePlan::Cpu { reason } => (Hardware::Cpu, reason.clone()),
            &DecodePlan::Nvdec { device, required } => {
                // Each frame a stream has out holds a surface when frames stay on the GPU.
                let held_frames = if self.config.gpu_frames {
                    self.config.pool.capacity()
                } else {
                    0
                };
                let hardware = Hardware::Nvdec {
                    device,
                    required,
                    held_frames,
                };
                (hardware, None)
            }
        };
        let required = matches!(hardware, Hardware::Nvdec { required: true, .. });
        let opened = match VideoDecoder::open_on(config, hardware) {
            Err(e @ DecodeError::NvdecUnavailable(_)) if !required => {
                // `auto`: the CPU decodes, and the status says why.
                VideoDecoder::open(config)
                    .inspect(|_| self.report(Some(ActiveDecoder::Cpu), Some(e.to_string())))
            }
            Ok(d) if hardware == Hardware::Cpu => {
                self.report(Some(ActiveDecoder::Cpu), cpu_reason);
                Ok(d)
            }
            other => other,
        };
        match opened {
            Ok(d) => {
                self.hardware_pending = d.hardware_outcome().is_some();
                self.decoder = Some(d);
            }
            Err(e) => {
                tracing::warn!(stream = %self.config.stream, error = %e, "cannot open decoder");
                if required {
                    self.report(None, Some(e.to_string()));
                }
            }
        }
    }

    /// Records what decodes, logging and counting each change once.
    fn report(&self, active: Option<ActiveDecoder>, reason: Option<String>) {
        if !self.config.status.set(active, reason.clone()) {
            return;
        }
        crate::telemetry::decoder_active(&self.config.stream, active);
        match (active, reason) {
            (Some(active), None) => {
                tracing::info!(stream = %self.config.stream, decoder = active.as_str(), "decoding")
            }
            (active, Some(reason)) => tracing::warn!(
                stream = %self.config.stream,
                decoder = active.map_or("none", ActiveDecoder::as_str),
                %reason,
                "not decoding on NVDEC"
            ),
            (None, None) => {}
        }
    }

    /// After NVDEC saw the stream's parameters: did it take the stream?
    fn check_hardware(&mut self, decoder: &VideoDecoder) {
        const NOT_OFFERED: &str =
            "NVDEC does not decode this stream (its codec profile, bit depth or size), or libnvcuvid is missing";
        let required = matches!(self.config.plan, DecodePlan::Nvdec { required: true, .. });
        match decoder.hardware_outcome() {
            Some(FormatOutcome::Pending) => return,
            Some(FormatOutcome::Hardware) => self.report(Some(ActiveDecoder::Nvdec), None),
            Some(FormatOutcome::NotOffered) if required => self.report(None, Some(NOT_OFFERED.into())),
            Some(FormatOutcome::NotOffered) => {
                self.report(Some(ActiveDecoder::Cpu), Some(NOT_OFFERED.into()))
            }
            None => {}
        }
        self.hardware_pending = false;
    }

    fn decode(&mut self, frame: EncodedFrame) {
        let Some(mut decoder) = self.decoder.take() else {
            self.counters.dropped(DropReason::DecodeError);
            return;
        };
        self.pending.insert(frame.pts_90k, frame.capture);
        while self.pending.len() > MAX_PENDING_TIMESTAMPS {
            self.pending.pop_first();
        }
        let result = decoder.decode(&frame.data, frame.pts_90k, &mut |pic| self.picture(pic));
        if let Err(e) = result {
            self.counters.dropped(DropReason::DecodeError);
            tracing::debug!(stream = %self.config.stream, error = %e, "access unit dropped");
        }
        if self.hardware_pending {
            self.check_hardware(&decoder);
        }
        self.decoder = Some(decoder);
    }

    fn picture(&mut self, mut pic: DecodedPicture<'_>) {
        self.counters.decoded();
        self.picture_epoch.store(self.decoder_epoch, Ordering::Release);
        let seq = self.next_seq;
        self.next_seq += 1;
        // Pictures come out in display order: entries before this one belong to pictures
        // the decoder discarded.
        let mut rest = self.pending.split_off(&pic.pts);
        let capture = rest.remove(&pic.pts).unwrap_or_else(|| CaptureTime {
            wall: self.config.clock.now(),
            source: ClockSource::LocalReceive,
            received: Instant::now(),
        });
        self.pending = rest;
        if !self.sampler.keep(pic.pts) {
            return;
        }
        let meta = FrameMeta {
            stream: self.config.stream.clone(),
            seq,
            pts: Pts::from_90k(pic.pts),
            capture,
        };
        let frame = match self.on_gpu(&mut pic) {
            Some(surface) => {
                let frame = self.config.pool.take_on_device(surface, meta);
                if frame.is_none() {
                    self.counters.dropped(DropReason::PoolExhausted);
                }
                frame
            }
            None => self.on_host(&mut pic, meta),
        };
        let Some(frame) = frame else {
            return;
        };
        if self.slot.put(frame).is_some() {
            self.counters.dropped(DropReason::Superseded);
        }
    }

    /// The picture left in GPU memory, when frames stay there and this one can.
    fn on_gpu(&mut self, pic: &mut DecodedPicture<'_>) -> Option<Arc<dyn DeviceSurface>> {
        let DecodePlan::Nvdec { device, .. } = self.config.plan else {
            return None;
        };
        if !self.config.gpu_frames || self.config.pool.outstanding() >= self.config.pool.capacity() {
            return None;
        }
        match pic.keep_on_gpu(device) {
            Ok(Some(surface)) => Some(Arc::new(surface)),
            // A CPU-decoded or 10-bit picture: converted here.
            Ok(None) => None,
            Err(e) => {
                tracing::debug!(stream = %self.config.stream, error = %e, "picture converted on the host instead");
                None
            }
        }
    }

    /// The picture converted to RGB in a pooled buffer; `None` when the pool is empty or
    /// the conversion fails (counted).
    fn on_host(&mut self, pic: &mut DecodedPicture<'_>, meta: FrameMeta) -> Option<Frame> {
        let Some(mut frame) = self.config.pool.take(pic.width, pic.height, meta) else {
            self.counters.dropped(DropReason::PoolExhausted);
            return None;
        };
        let stride = frame.stride();
        if let Err(e) = pic.to_rgb(frame.data_mut(), stride) {
            self.counters.dropped(DropReason::DecodeError);
            tracing::debug!(stream = %self.config.stream, error = %e, "conversion failed");
            return None;
        }
        Some(frame)
    }
}
