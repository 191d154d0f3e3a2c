//! mp4 files as streams, for tests, demos and benchmarks: demuxed with re_mp4 (H.264 avc1,
//! H.265 hvc1/hev1), optionally looped, and paced at the clip's own rate like a camera or
//! released as fast as the consumer takes them.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use peregrine_types::WallClock;
use re_mp4::{Mp4, StsdBoxContent, TrackKind};
use tokio::time::Instant;

use super::{EncodedFrame, Opener, Source, SourceError, StreamParameters};
use crate::decode::{Codec, DecoderConfig};
use crate::frame::{CaptureTime, ClockSource, Pts};

/// Files over this size are refused: the whole file is held in memory while it plays.
pub const MAX_FILE_BYTES: u64 = 1 << 30;

/// How a file source releases its frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pacing {
    /// At the clip's own timestamps, as a camera would send them.
    #[default]
    Realtime,
    /// As fast as the consumer takes them (benchmarks, decode capacity).
    AsFastAsPossible,
}

#[derive(Debug, Clone)]
pub struct FileOpener {
    pub path: PathBuf,
    /// Start again from the beginning at the end, with timestamps that keep increasing.
    pub looped: bool,
    pub pacing: Pacing,
    /// FFmpeg frame threads for the stream's decoder.
    pub decode_threads: usize,
    /// Frames are stamped with their release time on this clock.
    pub clock: Arc<dyn WallClock>,
}

impl Opener for FileOpener {
    fn open(&self) -> BoxFuture<'static, Result<Box<dyn Source>, SourceError>> {
        let this = self.clone();
        Box::pin(async move {
            let path = this.path.clone();
            let clip = tokio::task::spawn_blocking(move || Clip::load(&path, this.decode_threads))
                .await
                .map_err(|e| SourceError::Io {
                    path: this.path.display().to_string(),
                    reason: e.to_string(),
                })??;
            Ok(Box::new(FileSource {
                clip: Arc::new(clip),
                looped: this.looped,
                pacing: this.pacing,
                clock: this.clock.clone(),
                next: 0,
                loops: 0,
                started: Instant::now(),
            }) as Box<dyn Source>)
        })
    }

    fn describe(&self) -> String {
        format!("file {}", self.path.display())
    }
}

/// One video track's samples, in decode order, with timestamps in 90 kHz ticks.
#[derive(Debug)]
struct Clip {
    data: Bytes,
    samples: Vec<ClipSample>,
    /// Length of one pass through the clip, in 90 kHz ticks.
    duration_90k: i64,
    parameters: StreamParameters,
}

#[derive(Debug, Clone)]
struct ClipSample {
    range: std::ops::Range<usize>,
    dts_90k: i64,
    pts_90k: i64,
    is_key: bool,
}

fn to_90k(value: i64, timescale: u64) -> i64 {
    let timescale = i128::from(timescale.max(1));
    i64::try_from(i128::from(value) * i128::from(Pts::CLOCK_HZ) / timescale).unwrap_or(i64::MAX)
}

impl Clip {
    fn load(path: &std::path::Path, decode_threads: usize) -> Result<Self, SourceError> {
        let shown = path.display().to_string();
        let io = |e: std::io::Error| SourceError::Io {
            path: shown.clone(),
            reason: e.to_string(),
        };
        let len = std::fs::metadata(path).map_err(io)?.len();
        if len > MAX_FILE_BYTES {
            return Err(SourceError::Malformed {
                path: shown,
                reason: format!("{len} bytes, over the {MAX_FILE_BYTES}-byte limit for file sources"),
            });
        }
        let bytes = std::fs::read(path).map_err(io)?;
        let malformed = |reason: String| SourceError::Malformed {
            path: shown.clone(),
            reason,
        };
        let mp4 = Mp4::read_bytes(&bytes).map_err(|e| malformed(e.to_string()))?;
        let mut found = Vec::new();
        for track in mp4.tracks().values() {
            if track.kind != Some(TrackKind::Video) {
                continue;
            }
            let codec = match &track.trak(&mp4).mdia.minf.stbl.stsd.contents {
                StsdBoxContent::Avc1(_) => Codec::H264,
                StsdBoxContent::Hvc1(_) | StsdBoxContent::Hev1(_) => Codec::H265,
                _ => {
                    found.push(track.codec_string(&mp4).unwrap_or_else(|| "unknown".into()));
                    continue;
                }
            };
            let extradata = track
                .raw_codec_config(&mp4)
                .ok_or_else(|| malformed("video track without a codec configuration record".into()))?;
            let mut samples = Vec::with_capacity(track.samples.len());
            let mut end_90k = 0i64;
            for s in &track.samples {
                let range = s.byte_range();
                if range.end > bytes.len() || range.start > range.end {
                    return Err(malformed(format!("sample {} lies outside the file", s.id)));
                }
                let dts_90k = to_90k(s.decode_timestamp, s.timescale);
                let pts_90k = to_90k(s.composition_timestamp, s.timescale);
                let duration_90k = to_90k(i64::try_from(s.duration).unwrap_or(0), s.timescale);
                // With B-frames the last frame shown ends after the last one decoded; the
                // next pass must start after both.
                end_90k = end_90k.max(dts_90k.max(pts_90k).saturating_add(duration_90k));
                samples.push(ClipSample {
                    range,
                    dts_90k,
                    pts_90k,
                    is_key: s.is_sync,
                });
            }
            if samples.is_empty() {
                return Err(malformed("video track has no samples".into()));
            }
            let frame_rate = (end_90k > 0).then(|| samples.len() as f64 * 90_000.0 / end_90k as f64);
            return Ok(Self {
                data: Bytes::from(bytes),
                duration_90k: end_90k.max(1),
                parameters: StreamParameters {
                    decoder: DecoderConfig {
                        codec,
                        extradata: Some(extradata),
                        threads: decode_threads,
                    },
                    width: u32::from(track.width),
                    height: u32::from(track.height),
                    frame_rate,
                },
                samples,
            });
        }
        Err(SourceError::NoVideo {
            url: shown,
            found: if found.is_empty() {
                "no video track".into()
            } else {
                found.join(", ")
            },
        })
    }
}

struct FileSource {
    clip: Arc<Clip>,
    looped: bool,
    pacing: Pacing,
    clock: Arc<dyn WallClock>,
    /// Index of the next sample in the current pass.
    next: usize,
    loops: i64,
    started: Instant,
}

impl Source for FileSource {
    fn parameters(&self) -> Option<&StreamParameters> {
        Some(&self.clip.parameters)
    }

    fn is_live(&self) -> bool {
        self.pacing == Pacing::Realtime
    }

    fn next_frame(&mut self) -> BoxFuture<'_, Result<Option<EncodedFrame>, SourceError>> {
        Box::pin(async move {
            if self.next >= self.clip.samples.len() {
                if !self.looped {
                    return Ok(None);
                }
                self.next = 0;
                self.loops += 1;
            }
            let sample = &self.clip.samples[self.next];
            self.next += 1;
            let offset = self.loops.saturating_mul(self.clip.duration_90k);
            if self.pacing == Pacing::Realtime {
                let due = u64::try_from(offset.saturating_add(sample.dts_90k)).unwrap_or(0);
                let due = self.started + Duration::from_micros(due.saturating_mul(1_000_000) / 90_000);
                tokio::time::sleep_until(due).await;
            }
            Ok(Some(EncodedFrame {
                data: self.clip.data.slice(sample.range.clone()),
                pts_90k: offset.saturating_add(sample.pts_90k),
                capture: CaptureTime {
                    wall: self.clock.now(),
                    source: ClockSource::LocalReceive,
                    received: Instant::now(),
                },
                is_key: sample.is_key,
                new_parameters: None,
            }))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_clips::{clip, h265_clip};

    #[test]
    fn loads_h264_clip_with_avcc_record() {
        let c = Clip::load(&clip("bikes.mp4"), 1).unwrap();
        assert_eq!(c.parameters.decoder.codec, Codec::H264);
        assert_eq!((c.parameters.width, c.parameters.height), (640, 272));
        assert_eq!(
            c.parameters.decoder.extradata.as_ref().unwrap()[0],
            1,
            "avcC version 1"
        );
        let fps = c.parameters.frame_rate.unwrap();
        assert!((fps - 25.0).abs() < 0.5, "{fps}");
        assert!(c.samples[0].is_key);
    }

    #[test]
    fn loads_h265_clip() {
        let path = h265_clip();
        let c = Clip::load(&path, 1).unwrap();
        assert_eq!(c.parameters.decoder.codec, Codec::H265);
    }

    #[test]
    fn missing_and_non_mp4_files_are_errors_not_panics() {
        assert!(matches!(
            Clip::load(std::path::Path::new("/nonexistent.mp4"), 1),
            Err(SourceError::Io { .. })
        ));
        let dir = std::env::temp_dir().join(format!("pv-garbage-{}.mp4", std::process::id()));
        std::fs::write(&dir, b"\x00\x00\x00\x10garbagegarbage").unwrap();
        assert!(Clip::load(&dir, 1).is_err());
        let _ = std::fs::remove_file(&dir);
    }

    #[tokio::test(start_paused = true)]
    async fn looped_file_keeps_timestamps_increasing_and_paces_in_real_time() {
        let opener = FileOpener {
            path: clip("bikes.mp4"),
            looped: true,
            pacing: Pacing::Realtime,
            decode_threads: 1,
            clock: Arc::new(peregrine_types::SystemWallClock),
        };
        let mut source = opener.open().await.unwrap();
        let started = Instant::now();
        let frames = 250; // bikes.mp4: 10 s at 25 fps
        let mut first_pass_max = i64::MIN;
        let mut second_pass_min = i64::MAX;
        for i in 0..frames + 10 {
            let f = source.next_frame().await.unwrap().unwrap();
            if i < frames {
                first_pass_max = first_pass_max.max(f.pts_90k);
            } else {
                second_pass_min = second_pass_min.min(f.pts_90k);
            }
        }
        assert!(
            second_pass_min > first_pass_max,
            "second pass is offset past the first"
        );
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_secs(10), "paced: {elapsed:?}");
        assert!(second_pass_min >= 10 * 90_000, "offset by the clip's length");
    }
}
