//! RTSP cameras through retina: DESCRIBE, SETUP of the first H.264 or H.265 video stream
//! over TCP (interleaved) or UDP, PLAY, then depacketized access units. Frames are asked
//! for in Annex B form with parameter sets before every key frame, so the decoder needs no
//! out-of-band configuration and recovers by itself at the next key frame after a loss.
//! RTCP sender reports feed the stream's [`RtcpCaptureClock`].

use std::sync::Arc;
use std::time::SystemTime;

use futures_util::future::BoxFuture;
use futures_util::StreamExt;
use retina::client::{Credentials, Demuxed, PlayOptions, SessionOptions, SetupOptions, Transport};
use retina::codec::{CodecItem, FrameFormat, ParametersRef};
use tokio::time::Instant;
use url::Url;

use super::{EncodedFrame, Opener, Source, SourceError, StreamParameters};
use crate::clock::RtcpCaptureClock;
use crate::decode::{Codec, DecoderConfig};
use crate::frame::Pts;
use crate::policy::UrlPolicy;

/// How RTP travels from the camera.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RtspTransport {
    /// Interleaved on the RTSP connection: works through NAT and firewalls, no loss.
    #[default]
    Tcp,
    /// Separate UDP ports: lower latency on a LAN; lost packets lose frames.
    Udp,
}

#[derive(Clone)]
pub struct RtspOpener {
    /// Without credentials (they are kept apart so they never reach logs).
    url: Url,
    credentials: Option<Credentials>,
    transport: RtspTransport,
    decode_threads: usize,
    session_group: Arc<retina::client::SessionGroup>,
    /// Judges the host before every connection; the connection goes to the address judged.
    policy: Option<Arc<UrlPolicy>>,
}

impl std::fmt::Debug for RtspOpener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RtspOpener")
            .field("url", &self.url.as_str())
            .field("transport", &self.transport)
            .finish_non_exhaustive()
    }
}

impl RtspOpener {
    /// `url` may carry `user:password@`; they are moved into digest credentials.
    pub fn new(mut url: Url, transport: RtspTransport, decode_threads: usize) -> Self {
        let credentials = (!url.username().is_empty()).then(|| Credentials {
            username: percent_decode(url.username()),
            password: percent_decode(url.password().unwrap_or("")),
        });
        let _ = url.set_username("");
        let _ = url.set_password(None);
        Self {
            url,
            credentials,
            transport,
            decode_threads,
            session_group: Arc::new(retina::client::SessionGroup::default()),
            policy: None,
        }
    }

    /// Checks the URL's host with `policy` before every connection (a name may resolve
    /// elsewhere by then) and connects to the very address it allowed.
    pub fn guarded_by(mut self, policy: Arc<UrlPolicy>) -> Self {
        self.policy = Some(policy);
        self
    }

    /// The URL to connect to: the host replaced by the address the policy allowed.
    async fn checked_target(&self) -> Result<Url, SourceError> {
        let Some(policy) = &self.policy else {
            return Ok(self.url.clone());
        };
        let refused = |reason: String| SourceError::Connect {
            url: self.url.to_string(),
            reason,
        };
        let address = policy
            .rtsp_address(&self.url)
            .await
            .map_err(|r| refused(format!("stream url refused: {r}")))?;
        let mut target = self.url.clone();
        target
            .set_ip_host(address)
            .map_err(|()| refused(format!("cannot address {address} in the url")))?;
        Ok(target)
    }
}

fn percent_decode(s: &str) -> String {
    url::form_urlencoded::parse(format!("x={s}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

impl Opener for RtspOpener {
    fn open(&self) -> BoxFuture<'static, Result<Box<dyn Source>, SourceError>> {
        let this = self.clone();
        Box::pin(async move { this.connect().await.map(|s| Box::new(s) as Box<dyn Source>) })
    }

    fn describe(&self) -> String {
        format!("{} over {:?}", self.url, self.transport).to_lowercase()
    }
}

impl RtspOpener {
    async fn connect(&self) -> Result<RtspSource, SourceError> {
        let url_text = self.url.to_string();
        let connect_err = |e: retina::Error| SourceError::Connect {
            url: url_text.clone(),
            reason: e.to_string(),
        };
        let options = SessionOptions::default()
            .creds(self.credentials.clone())
            .user_agent("peregrine".to_string())
            .session_group(self.session_group.clone());
        let target = self.checked_target().await?;
        let mut session = retina::client::Session::describe(target, options)
            .await
            .map_err(connect_err)?;
        let found: Vec<String> = session
            .streams()
            .iter()
            .map(|s| format!("{}/{}", s.media(), s.encoding_name()))
            .collect();
        let Some((index, codec)) = session.streams().iter().enumerate().find_map(|(i, s)| {
            let codec = match (s.media(), s.encoding_name()) {
                ("video", "h264") => Codec::H264,
                ("video", "h265") => Codec::H265,
                _ => return None,
            };
            Some((i, codec))
        }) else {
            return Err(SourceError::NoVideo {
                url: url_text,
                found: found.join(", "),
            });
        };
        let stream = &session.streams()[index];
        let clock_rate = stream.clock_rate_hz();
        // The decoder needs only the codec (parameter sets come in-band), so a stream whose
        // SDP omits them starts at 0x0 and learns its size from the first frame.
        let parameters = stream
            .parameters()
            .and_then(|p| video_parameters(p, codec, self.decode_threads))
            .unwrap_or(StreamParameters {
                decoder: DecoderConfig {
                    codec,
                    extradata: None,
                    threads: self.decode_threads,
                },
                width: 0,
                height: 0,
                frame_rate: None,
            });
        let transport = match self.transport {
            RtspTransport::Tcp => Transport::Tcp(Default::default()),
            RtspTransport::Udp => Transport::Udp(Default::default()),
        };
        session
            .setup(
                index,
                SetupOptions::default()
                    .transport(transport)
                    .frame_format(FrameFormat::SIMPLE),
            )
            .await
            .map_err(connect_err)?;
        let playing = session.play(PlayOptions::default()).await.map_err(connect_err)?;
        let demuxed = playing.demuxed().map_err(connect_err)?;
        Ok(RtspSource {
            url: url_text,
            demuxed,
            codec,
            clock_rate,
            decode_threads: self.decode_threads,
            parameters: Some(parameters),
            announced: None,
            clock: RtcpCaptureClock::default(),
            video_stream: index,
        })
    }
}

fn video_parameters(p: ParametersRef<'_>, codec: Codec, threads: usize) -> Option<StreamParameters> {
    let ParametersRef::Video(v) = p else { return None };
    let (width, height) = v.pixel_dimensions();
    Some(StreamParameters {
        decoder: DecoderConfig {
            codec,
            // Annex B with in-band parameter sets (FrameFormat::SIMPLE).
            extradata: None,
            threads,
        },
        width,
        height,
        frame_rate: v
            .frame_rate()
            .filter(|(num, _)| *num > 0)
            .map(|(num, den)| f64::from(den) / f64::from(num)),
    })
}

struct RtspSource {
    url: String,
    demuxed: Demuxed,
    codec: Codec,
    clock_rate: u32,
    decode_threads: usize,
    parameters: Option<StreamParameters>,
    /// What the last frame announced, to tell real changes from repeats.
    announced: Option<StreamParameters>,
    clock: RtcpCaptureClock,
    video_stream: usize,
}

impl Source for RtspSource {
    fn parameters(&self) -> Option<&StreamParameters> {
        self.parameters.as_ref()
    }

    fn next_frame(&mut self) -> BoxFuture<'_, Result<Option<EncodedFrame>, SourceError>> {
        Box::pin(async move {
            loop {
                let item = match self.demuxed.next().await {
                    Some(Ok(item)) => item,
                    Some(Err(e)) => {
                        return Err(SourceError::Stream {
                            url: self.url.clone(),
                            reason: e.to_string(),
                        })
                    }
                    None => {
                        return Err(SourceError::Stream {
                            url: self.url.clone(),
                            reason: "the server ended the session".into(),
                        })
                    }
                };
                match item {
                    CodecItem::VideoFrame(frame) if frame.stream_id() == self.video_stream => {
                        return Ok(Some(self.encoded(frame)));
                    }
                    CodecItem::Rtcp(rtcp) if rtcp.stream_id() == self.video_stream => {
                        if let Some(rtp) = rtcp.rtp_timestamp() {
                            let sr = rtcp
                                .pkts()
                                .next()
                                .and_then(|p| p.as_sender_report().ok().flatten());
                            if let Some(sr) = sr {
                                self.clock.on_sender_report(rtp.timestamp(), sr.ntp_timestamp().0);
                            }
                        }
                    }
                    _ => {}
                }
            }
        })
    }
}

impl RtspSource {
    fn encoded(&mut self, frame: retina::codec::VideoFrame) -> EncodedFrame {
        let ts = frame.timestamp();
        let rate = i64::from(ts.clock_rate().get());
        let pts_90k = i64::try_from(i128::from(ts.elapsed()) * i128::from(Pts::CLOCK_HZ) / i128::from(rate))
            .unwrap_or(i64::MAX);
        let ctx = frame.start_ctx();
        let received = Instant::from_std(ctx.received());
        let received_wall = SystemTime::from(ctx.received_wall());
        let capture = self
            .clock
            .capture_time(ts.timestamp(), self.clock_rate, received, received_wall);
        let mut new_parameters = None;
        if frame.has_new_parameters() {
            let stream = &self.demuxed.streams()[self.video_stream];
            let params = stream
                .parameters()
                .and_then(|p| video_parameters(p, self.codec, self.decode_threads));
            // The decoder follows in-band parameter sets itself; it is reopened only when the
            // picture size changes, never for a repeat of the same parameters.
            let changed = params.as_ref().is_some_and(|p| {
                self.announced
                    .as_ref()
                    .or(self.parameters.as_ref())
                    .is_some_and(|old| (old.width, old.height) != (p.width, p.height))
            });
            if changed {
                new_parameters = params.clone();
            }
            if params.is_some() {
                self.announced = params;
            }
        }
        EncodedFrame {
            is_key: frame.is_random_access_point(),
            data: bytes::Bytes::from(frame.into_data()),
            pts_90k,
            capture,
            new_parameters,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_leave_the_url() {
        let url = Url::parse("rtsp://admin:p%40ss@camera.local:554/stream1").unwrap();
        let o = RtspOpener::new(url, RtspTransport::Udp, 2);
        assert_eq!(o.url.as_str(), "rtsp://camera.local:554/stream1");
        let c = o.credentials.as_ref().unwrap();
        assert_eq!((c.username.as_str(), c.password.as_str()), ("admin", "p@ss"));
        assert!(!o.describe().contains("p@ss") && !format!("{o:?}").contains("ss@"));
    }
}
