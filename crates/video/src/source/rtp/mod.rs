//! Pushed RTP, as GB28181 cameras send it: MPEG-PS (or plain H.264/H.265) in RTP over UDP,
//! or over TCP with RFC 4571 framing, the camera connecting to us (passive) or we to it
//! (active). The pure pieces each have their module and fuzz target: [`packet`] (RTP
//! headers), [`jitter`] (the reordering buffer), [`ps`] (the program stream demuxer),
//! [`depacketize`] (RFC 6184 / RFC 7798), [`nal`] (Annex B), [`timeline`] (timestamps
//! to presentation and capture times) and [`rtcp`] (sender reports, which put capture times
//! on the camera's own clock); [`endpoint`] reads the stream URL. This module
//! is the source around them: it receives packets, keeps to one SSRC, and turns what
//! comes out in order into access units for the decoder.

pub mod depacketize;
pub mod endpoint;
pub mod fuzzing;
pub mod jitter;
pub mod nal;
pub mod packet;
pub mod ps;
pub mod rtcp;
pub mod timeline;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use futures_util::future::BoxFuture;
use peregrine_types::WallClock;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::time::Instant;

use super::{EncodedFrame, Opener, Source, SourceError, StreamParameters};
use crate::decode::{Codec, DecoderConfig};
use crate::policy::UrlPolicy;
use depacketize::NalDepacketizer;
use endpoint::{RtpEndpoint, RtpFormat, RtpTransport};
use jitter::{JitterBuffer, JitterConfig, Released};
use packet::RtpPacket;
use ps::PsDemuxer;
use rtcp::SenderReport;
use timeline::RtpTimeline;

/// Packets from another SSRC in a row that make the source start again with that sender
/// (a camera that restarted); fewer are a stray sender's, and ignored.
const SSRC_SWITCH_AFTER: u32 = 64;
/// The largest datagram taken (RTP over UDP stays under the path MTU; this is IP's limit).
const MAX_DATAGRAM: usize = 65_536;
/// The UDP socket's receive buffer asked for: a key frame of a 4K camera arrives as a
/// burst of several hundred kilobytes, more than Linux's default buffer holds while the
/// task is busy. The kernel caps it at `net.core.rmem_max`.
const UDP_RECEIVE_BUFFER: usize = 4 << 20;

/// Opens a pushed RTP stream: binds (UDP, passive TCP) or connects (active TCP).
#[derive(Clone)]
pub struct RtpOpener {
    endpoint: RtpEndpoint,
    decode_threads: usize,
    jitter: JitterConfig,
    clock: Arc<dyn WallClock>,
    /// Judges an active connection's host before every connection.
    policy: Option<Arc<UrlPolicy>>,
}

impl std::fmt::Debug for RtpOpener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RtpOpener")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl RtpOpener {
    pub fn new(endpoint: RtpEndpoint, decode_threads: usize, clock: Arc<dyn WallClock>) -> Self {
        Self {
            endpoint,
            decode_threads,
            jitter: JitterConfig::default(),
            clock,
            policy: None,
        }
    }

    pub fn guarded_by(mut self, policy: Arc<UrlPolicy>) -> Self {
        self.policy = Some(policy);
        self
    }

    pub fn with_jitter(mut self, jitter: JitterConfig) -> Self {
        self.jitter = jitter;
        self
    }

    fn connect_error(&self, reason: impl ToString) -> SourceError {
        SourceError::Connect {
            url: self.endpoint.url.to_string(),
            reason: reason.to_string(),
        }
    }

    async fn input(&self) -> Result<Input, SourceError> {
        let bind = || {
            self.endpoint
                .bind_address()
                .ok_or_else(|| self.connect_error("the url names no address to listen on"))
        };
        Ok(match self.endpoint.transport {
            RtpTransport::Udp => {
                let address = bind()?;
                let socket = bind_udp(address)
                    .map_err(|e| self.connect_error(format!("cannot listen on udp {address}: {e}")))?;
                Input::udp(socket)
            }
            RtpTransport::TcpPassive => {
                let address = bind()?;
                let listener = TcpListener::bind(address)
                    .await
                    .map_err(|e| self.connect_error(format!("cannot listen on tcp {address}: {e}")))?;
                Input::Listening(listener)
            }
            RtpTransport::TcpActive => {
                let url = &self.endpoint.url;
                let ip = match &self.policy {
                    Some(policy) => policy
                        .rtsp_address(url)
                        .await
                        .map_err(|r| self.connect_error(format!("stream url refused: {r}")))?,
                    None => {
                        let host = url.host_str().unwrap_or_default().trim_matches(['[', ']']);
                        let port = url.port().unwrap_or_default();
                        tokio::net::lookup_host((host, port))
                            .await
                            .ok()
                            .and_then(|mut a| a.next())
                            .map(|a| a.ip())
                            .ok_or_else(|| self.connect_error(format!("{host} does not resolve")))?
                    }
                };
                let address = SocketAddr::new(ip, url.port().unwrap_or_default());
                let stream = TcpStream::connect(address)
                    .await
                    .map_err(|e| self.connect_error(format!("cannot connect to {address}: {e}")))?;
                Input::tcp(stream)
            }
        })
    }
}

pub(crate) fn bind_udp(address: SocketAddr) -> std::io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(address), Type::DGRAM, Some(Protocol::UDP))?;
    // Best effort: a smaller buffer still works, it only drops more in a burst.
    let _ = socket.set_recv_buffer_size(UDP_RECEIVE_BUFFER);
    socket.bind(&address.into())?;
    socket.set_nonblocking(true)?;
    UdpSocket::from_std(socket.into())
}

impl Opener for RtpOpener {
    fn open(&self) -> BoxFuture<'static, Result<Box<dyn Source>, SourceError>> {
        let this = self.clone();
        Box::pin(async move {
            let input = this.input().await?;
            let source = RtpSource::new(
                this.endpoint.url.to_string(),
                input,
                this.endpoint.format,
                this.decode_threads,
                this.jitter,
                this.clock.clone(),
            );
            Ok(Box::new(source) as Box<dyn Source>)
        })
    }

    fn describe(&self) -> String {
        let e = &self.endpoint;
        let how = match e.transport {
            RtpTransport::Udp => "rtp over udp, listening",
            RtpTransport::TcpPassive => "rtp over tcp, listening",
            RtpTransport::TcpActive => "rtp over tcp, connecting",
        };
        let what = match e.format {
            RtpFormat::Ps(_) => "mpeg-ps",
            RtpFormat::Nal(Codec::H264) => "h264",
            RtpFormat::Nal(Codec::H265) => "h265",
        };
        format!("{} ({how}, {what})", e.url)
    }
}

fn parameters(codec: Codec, threads: usize) -> StreamParameters {
    StreamParameters {
        // Annex B with in-band parameter sets, as RTSP's.
        decoder: DecoderConfig {
            codec,
            extradata: None,
            threads,
        },
        width: 0,
        height: 0,
        frame_rate: None,
    }
}

pub(crate) enum Input {
    /// The RTP socket, and where the camera sends RTCP when it uses the next port up.
    Udp {
        rtp: UdpSocket,
        rtcp: Option<UdpSocket>,
        buf: Vec<u8>,
        rtcp_buf: Vec<u8>,
    },
    /// Passive TCP before the sender connected.
    Listening(TcpListener),
    /// A TCP connection and what has been read of it but not yet framed.
    Tcp(TcpStream, BytesMut),
}

impl Input {
    pub(crate) fn udp(socket: UdpSocket) -> Self {
        Input::Udp {
            rtp: socket,
            rtcp: None,
            buf: vec![0; MAX_DATAGRAM],
            rtcp_buf: Vec::new(),
        }
    }

    /// UDP with RTCP received on a port of its own as well.
    pub(crate) fn udp_with_rtcp(rtp: UdpSocket, rtcp: UdpSocket) -> Self {
        Input::Udp {
            rtp,
            rtcp: Some(rtcp),
            buf: vec![0; MAX_DATAGRAM],
            rtcp_buf: vec![0; 2048],
        }
    }

    pub(crate) fn tcp(stream: TcpStream) -> Self {
        let _ = stream.set_nodelay(true);
        Input::Tcp(stream, BytesMut::with_capacity(2 * MAX_DATAGRAM))
    }

    /// The next packet's bytes; `Ok(None)` when a TCP sender closed the connection.
    /// Cancel-safe (the source drops it when the jitter buffer's deadline comes first):
    /// bytes read from TCP stay in the buffer until a whole frame is there.
    async fn receive(&mut self) -> std::io::Result<Option<Bytes>> {
        loop {
            match self {
                Input::Udp {
                    rtp, rtcp: None, buf, ..
                } => {
                    let (n, _) = rtp.recv_from(buf).await?;
                    return Ok(Some(Bytes::copy_from_slice(&buf[..n])));
                }
                Input::Udp {
                    rtp,
                    rtcp: Some(rtcp),
                    buf,
                    rtcp_buf,
                } => {
                    // Both receives are cancel-safe: the one not chosen loses nothing.
                    return tokio::select! {
                        r = rtp.recv_from(buf) => Ok(Some(Bytes::copy_from_slice(&buf[..r?.0]))),
                        r = rtcp.recv_from(rtcp_buf) => Ok(Some(Bytes::copy_from_slice(&rtcp_buf[..r?.0]))),
                    };
                }
                Input::Listening(listener) => {
                    let (stream, peer) = listener.accept().await?;
                    tracing::info!(%peer, "rtp sender connected");
                    *self = Input::tcp(stream);
                }
                Input::Tcp(stream, buf) => {
                    // RFC 4571: a 16-bit length, then the packet.
                    if let [hi, lo, ..] = buf[..] {
                        let len = usize::from(u16::from_be_bytes([hi, lo]));
                        if buf.len() >= 2 + len {
                            buf.advance(2);
                            return Ok(Some(buf.split_to(len).freeze()));
                        }
                    }
                    buf.reserve(MAX_DATAGRAM);
                    if stream.read_buf(buf).await? == 0 {
                        return Ok(None);
                    }
                }
            }
        }
    }
}

enum Payload {
    Ps(PsDemuxer),
    Nal(NalDepacketizer),
}

pub(crate) struct RtpSource {
    url: String,
    input: Input,
    /// The signalling's word that the sender ended (a GB28181 device's BYE or going
    /// offline); dropping it hangs up.
    session: Option<BoxFuture<'static, String>>,
    /// The sender followed, and how many packets in a row came from another.
    ssrc: Option<u32>,
    foreign: u32,
    jitter: JitterBuffer,
    payload: Payload,
    timeline: RtpTimeline,
    /// The camera's last RTCP sender report: capture times go on its clock from then.
    sender_report: Option<SenderReport>,
    /// PS only: the RTP timestamp minus the PES timestamp of the same frame (cameras
    /// usually make them equal, but need not), learned at frames that end on a marker.
    pes_to_rtp: Option<u32>,
    /// What the decoder was opened with (none until a PS stream names its codec).
    parameters: Option<StreamParameters>,
    announced: Option<StreamParameters>,
    decode_threads: usize,
    clock: Arc<dyn WallClock>,
    ready: VecDeque<EncodedFrame>,
}

impl RtpSource {
    pub(crate) fn new(
        url: String,
        input: Input,
        format: RtpFormat,
        decode_threads: usize,
        jitter: JitterConfig,
        clock: Arc<dyn WallClock>,
    ) -> RtpSource {
        let payload = match format {
            RtpFormat::Ps(codec) => Payload::Ps(PsDemuxer::with_codec(codec)),
            RtpFormat::Nal(codec) => Payload::Nal(NalDepacketizer::new(codec)),
        };
        let parameters = match format {
            RtpFormat::Nal(codec) | RtpFormat::Ps(Some(codec)) => Some(parameters(codec, decode_threads)),
            RtpFormat::Ps(None) => None,
        };
        let timestamp_bits = match payload {
            // PES timestamps are 33 bits; plain RTP's are 32.
            Payload::Ps(_) => 33,
            Payload::Nal(_) => 32,
        };
        RtpSource {
            url,
            input,
            session: None,
            ssrc: None,
            foreign: 0,
            jitter: JitterBuffer::new(jitter),
            payload,
            timeline: RtpTimeline::new(timestamp_bits),
            sender_report: None,
            pes_to_rtp: None,
            announced: parameters.clone(),
            parameters,
            decode_threads,
            clock,
            ready: VecDeque::new(),
        }
    }

    /// Ends the source with the reason `ended` resolves to; holding it keeps the session.
    pub(crate) fn with_session(mut self, ended: BoxFuture<'static, String>) -> RtpSource {
        self.session = Some(ended);
        self
    }
}

impl Source for RtpSource {
    fn parameters(&self) -> Option<&StreamParameters> {
        self.parameters.as_ref()
    }

    fn next_frame(&mut self) -> BoxFuture<'_, Result<Option<EncodedFrame>, SourceError>> {
        Box::pin(async move {
            loop {
                if let Some(frame) = self.ready.pop_front() {
                    return Ok(Some(frame));
                }
                let now = std::time::Instant::now();
                while let Some(released) = self.jitter.pop_ready(now) {
                    self.on_released(released);
                }
                if !self.ready.is_empty() {
                    continue;
                }
                let deadline = self.jitter.deadline().map(Instant::from_std);
                let received = tokio::select! {
                    received = self.input.receive() => received,
                    () = sleep_until(deadline) => continue,
                    reason = session_end(&mut self.session) => {
                        self.session = None;
                        return Err(self.stream_error(reason));
                    }
                };
                let data = match received {
                    Ok(Some(data)) => data,
                    Ok(None) => return Err(self.stream_error("the sender closed the connection")),
                    Err(e) => return Err(self.stream_error(e)),
                };
                self.on_datagram(data)?;
            }
        })
    }
}

impl Drop for RtpSource {
    fn drop(&mut self) {
        // One line per connection: what the network did to it.
        let j = self.jitter.stats();
        let (units, dropped) = match &self.payload {
            Payload::Ps(d) => (d.stats().access_units, d.stats().dropped),
            Payload::Nal(d) => (d.stats().access_units, d.stats().dropped),
        };
        tracing::info!(
            url = %self.url,
            packets = j.received,
            lost = j.lost,
            late = j.late,
            duplicates = j.duplicates,
            restarts = j.restarts,
            access_units = units,
            access_units_dropped = dropped,
            "rtp connection ended"
        );
    }
}

async fn session_end(session: &mut Option<BoxFuture<'static, String>>) -> String {
    match session {
        Some(ended) => ended.await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

impl RtpSource {
    fn stream_error(&self, reason: impl ToString) -> SourceError {
        SourceError::Stream {
            url: self.url.clone(),
            reason: reason.to_string(),
        }
    }

    fn on_datagram(&mut self, data: Bytes) -> Result<(), SourceError> {
        if rtcp::is_rtcp(&data) {
            // Only the followed sender's reports (a stray sender's would move its clock).
            if let Some(report) = rtcp::sender_report(&data) {
                if self.ssrc.is_none_or(|s| s == report.ssrc) {
                    self.sender_report = Some(report);
                }
            }
            return Ok(());
        }
        let Ok(packet) = RtpPacket::parse(data) else {
            // Not RTP (a stray datagram): ignored.
            return Ok(());
        };
        // Dynamic payload types only (GB28181: 96 PS, 98 H.264...).
        if packet.payload_type < 96 {
            return Ok(());
        }
        match self.ssrc {
            None => self.ssrc = Some(packet.ssrc),
            Some(ssrc) if ssrc == packet.ssrc => self.foreign = 0,
            Some(ssrc) => {
                self.foreign += 1;
                if self.foreign >= SSRC_SWITCH_AFTER {
                    // Starting again resets the jitter buffer, demuxer and timeline.
                    return Err(self.stream_error(format!(
                        "the sender changed from ssrc {ssrc:#010x} to {:#010x}",
                        packet.ssrc
                    )));
                }
                return Ok(());
            }
        }
        self.jitter.push(packet, std::time::Instant::now());
        Ok(())
    }

    fn on_released(&mut self, released: Released) {
        let Released { packet, lost_before } = released;
        match &mut self.payload {
            Payload::Ps(demuxer) => {
                let mut units = Vec::new();
                if lost_before > 0 {
                    demuxer.lost();
                }
                demuxer.push(&packet.payload, &mut units);
                // Units completed by the next PES's start belong to an earlier packet;
                // those completed by this packet's marker are its own frame.
                let own_from = units.len();
                if packet.marker {
                    demuxer.end_of_frame(&mut units);
                }
                for (i, au) in units.into_iter().enumerate() {
                    let Some(codec) = au.codec else {
                        // Nothing names the codec yet (no PSM, no parameter sets): nothing
                        // could decode it either.
                        continue;
                    };
                    // The PES's PTS; the packet's RTP timestamp (the same clock) without one.
                    let timestamp = au.pts_90k.unwrap_or(u64::from(packet.timestamp));
                    let rtp_timestamp = match au.pts_90k {
                        None => Some(packet.timestamp),
                        Some(pts) if i >= own_from => {
                            self.pes_to_rtp = Some(packet.timestamp.wrapping_sub(pts as u32));
                            Some(packet.timestamp)
                        }
                        Some(pts) => self.pes_to_rtp.map(|o| (pts as u32).wrapping_add(o)),
                    };
                    let is_key = nal::access_unit_is_key(codec, &au.data);
                    self.emit(codec, au.data, (timestamp, rtp_timestamp), is_key);
                }
            }
            Payload::Nal(depacketizer) => {
                let mut units = Vec::new();
                depacketizer.push(&packet, lost_before, &mut units);
                let codec = match self.parameters.as_ref() {
                    Some(p) => p.decoder.codec,
                    None => return,
                };
                for au in units {
                    let timestamp = (u64::from(au.timestamp), Some(au.timestamp));
                    self.emit(codec, au.data, timestamp, au.is_key);
                }
            }
        }
    }

    /// `timestamp`: the unit's timestamp for the timeline (PES or RTP) and its RTP
    /// timestamp when known, which a sender report maps to the camera's clock.
    fn emit(&mut self, codec: Codec, data: Bytes, timestamp: (u64, Option<u32>), is_key: bool) {
        let received_wall = self.clock.now();
        let (pts_90k, mut capture) = self.timeline.stamp(timestamp.0, Instant::now(), received_wall);
        if let (Some(report), Some(rtp)) = (self.sender_report, timestamp.1) {
            // Signed: a unit may come a little before the report's instant.
            let ticks = i64::from(rtp.wrapping_sub(report.rtp_timestamp) as i32);
            capture.wall = timeline::shift(report.wall, ticks);
            capture.source = crate::frame::ClockSource::RtcpSenderReport;
        }
        // The decoder is opened (again) when the codec is first known or changes.
        let new_parameters = match &self.announced {
            Some(p) if p.decoder.codec == codec => None,
            _ => {
                let p = parameters(codec, self.decode_threads);
                self.announced = Some(p.clone());
                Some(p)
            }
        };
        self.ready.push_back(EncodedFrame {
            data,
            pts_90k,
            capture,
            is_key,
            new_parameters,
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::AsyncWriteExt;

    use super::*;

    #[tokio::test]
    async fn a_tcp_read_cut_short_by_the_jitter_deadline_loses_nothing() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut sender = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let mut input = Input::Listening(listener);
        let frame = |body: &[u8]| [&(body.len() as u16).to_be_bytes()[..], body].concat();
        sender.write_all(&frame(b"first")).await.unwrap();
        assert_eq!(input.receive().await.unwrap().as_deref(), Some(&b"first"[..]));
        // Half a frame, then the receive is dropped as a deadline would drop it.
        let second = frame(b"second packet");
        sender.write_all(&second[..5]).await.unwrap();
        let cut = tokio::time::timeout(Duration::from_millis(50), input.receive()).await;
        assert!(cut.is_err(), "half a frame is not a packet");
        sender.write_all(&second[5..]).await.unwrap();
        assert_eq!(
            input.receive().await.unwrap().as_deref(),
            Some(&b"second packet"[..])
        );
        drop(sender);
        assert_eq!(input.receive().await.unwrap(), None, "the sender closed");
    }

    #[test]
    fn udp_sockets_get_a_larger_receive_buffer() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let socket = bind_udp("127.0.0.1:0".parse().unwrap()).unwrap();
        let size = socket2::SockRef::from(&socket).recv_buffer_size().unwrap();
        // Linux doubles what it grants; the default is about 200 kB.
        assert!(size > 256 << 10, "{size}");
    }
}
