//! A GB28181 device on the network for the server to talk to: the crate's
//! [`SimulatedDevice`] over a real SIP socket (UDP, or one TCP connection), pushing the
//! bikes clip as PS over RTP wherever an INVITE asks, with loss and reordering when told.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::{Buf, BytesMut};
use peregrine_gb28181::framing::{self, Frame};
use peregrine_gb28181::sdp::MediaTransport;
use peregrine_gb28181::simulated::{DeviceIdentity, MediaTarget, SimulatedDevice};
use peregrine_video::rtp::rtcp::{encode_sender_report, SenderReport};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::mpsc;

use crate::rtp_pusher::{packetize, Impairment, PsFrame};

/// The clip's frame interval (25 fps).
pub const FRAME: Duration = Duration::from_millis(40);

/// What the test sees of the device and tells it.
#[derive(Default)]
pub struct DeviceState {
    /// Keepalives are sent while this is on.
    pub keepalives: AtomicBool,
    /// Set to make the device REGISTER again (and turn keepalives back on).
    pub register_again: AtomicBool,
    pub registered: AtomicUsize,
    pub plays: AtomicUsize,
    pub byes: AtomicUsize,
    /// Call-IDs being pushed; a BYE removes its own.
    pub pushing: Mutex<Vec<String>>,
    /// Media targets of every INVITE, in order.
    pub targets: Mutex<Vec<MediaTarget>>,
}

/// How a device sends its media.
#[derive(Clone)]
pub struct Media {
    pub frames: Arc<Vec<PsFrame>>,
    pub impairment: Impairment,
    /// Wait for this many INVITEs, then push all of them from the same first frame, frame
    /// by frame together (two channels of one camera); 1 pushes each at once.
    pub lockstep: usize,
    /// Times the clip is pushed, one after the other (the camera restarting its clip
    /// each time, as a looping file camera does).
    pub rounds: u32,
    /// Send RTCP sender reports every second, from a device clock this far behind the
    /// real time (`None`: no RTCP, as many cameras).
    pub clock_behind: Option<Duration>,
}

enum SipLink {
    Udp(Arc<UdpSocket>, SocketAddr),
    Tcp(tokio::net::tcp::OwnedWriteHalf),
}

impl SipLink {
    async fn send(&mut self, text: &str) {
        match self {
            SipLink::Udp(socket, to) => {
                let _ = socket.send_to(text.as_bytes(), *to).await;
            }
            SipLink::Tcp(writer) => {
                let _ = writer.write_all(text.as_bytes()).await;
            }
        }
    }
}

/// Starts a device that registers with the server at `server` and stays until the test ends.
pub async fn start(identity: DeviceIdentity, server: SocketAddr, media: Media) -> Arc<DeviceState> {
    let state = Arc::new(DeviceState::default());
    state.keepalives.store(true, Ordering::Relaxed);
    let tcp = identity.tcp;
    let (incoming_tx, incoming) = mpsc::channel::<Vec<u8>>(64);
    let mut identity = identity;
    // Where the server connects for TCP active media (the answers name its port).
    let media_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    identity.media_port = media_listener.local_addr().unwrap().port();
    let media_listener = Arc::new(media_listener);
    let link = if tcp {
        let stream = TcpStream::connect(server).await.expect("SIP over TCP connects");
        identity.address = stream.local_addr().unwrap().to_string();
        let (mut reader, writer) = stream.into_split();
        tokio::spawn(async move {
            let mut buf = BytesMut::new();
            loop {
                match framing::next_frame(&buf).expect("the server speaks SIP") {
                    Frame::Message { start, end } => {
                        let _ = incoming_tx.send(buf[start..end].to_vec()).await;
                        buf.advance(end);
                        continue;
                    }
                    Frame::Partial { skip } => buf.advance(skip),
                }
                if reader.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                    return;
                }
            }
        });
        SipLink::Tcp(writer)
    } else {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        identity.address = socket.local_addr().unwrap().to_string();
        let socket = Arc::new(socket);
        let reading = socket.clone();
        tokio::spawn(async move {
            let mut buf = vec![0; 65_536];
            while let Ok((n, _)) = reading.recv_from(&mut buf).await {
                if incoming_tx.send(buf[..n].to_vec()).await.is_err() {
                    return;
                }
            }
        });
        SipLink::Udp(socket, server)
    };
    let device = SimulatedDevice::new(identity);
    tokio::spawn(run(device, link, incoming, state.clone(), media, media_listener));
    state
}

async fn run(
    mut device: SimulatedDevice,
    mut link: SipLink,
    mut incoming: mpsc::Receiver<Vec<u8>>,
    state: Arc<DeviceState>,
    media: Media,
    media_listener: Arc<TcpListener>,
) {
    let register = device.register(None, 3600);
    link.send(&register).await;
    let mut keepalive = tokio::time::interval(Duration::from_millis(400));
    let mut waiting: Vec<MediaTarget> = Vec::new();
    loop {
        tokio::select! {
            message = incoming.recv() => {
                let Some(bytes) = message else { return };
                let reaction = device.on_message(&bytes);
                for text in &reaction.send {
                    link.send(text).await;
                }
                if reaction.registered == Some(Ok(())) {
                    state.registered.fetch_add(1, Ordering::Relaxed);
                }
                if let Some(call_id) = reaction.stop {
                    state.byes.fetch_add(1, Ordering::Relaxed);
                    state.pushing.lock().unwrap().retain(|c| *c != call_id);
                }
                if let Some(target) = reaction.play {
                    state.plays.fetch_add(1, Ordering::Relaxed);
                    state.targets.lock().unwrap().push(target.clone());
                    waiting.push(target);
                    if waiting.len() >= media.lockstep {
                        let targets = std::mem::take(&mut waiting);
                        let listener = media_listener.clone();
                        tokio::spawn(push(targets, media.clone(), state.clone(), listener));
                    }
                }
            }
            _ = keepalive.tick() => {
                if state.register_again.swap(false, Ordering::Relaxed) {
                    let register = device.register(None, 3600);
                    link.send(&register).await;
                    state.keepalives.store(true, Ordering::Relaxed);
                }
                if state.keepalives.load(Ordering::Relaxed) {
                    let text = device.keepalive();
                    link.send(&text).await;
                }
            }
        }
    }
}

/// A packet of round `round`: RTP sequence numbers and timestamps go on from the round
/// before, as a camera's do (the PES timestamps inside start again, as a file camera's).
fn next_round(packet: &[u8], round: u32, packets: usize, frames: u32) -> Vec<u8> {
    let mut p = packet.to_vec();
    let seq = u16::from_be_bytes([p[2], p[3]]).wrapping_add((round as usize * packets) as u16);
    p[2..4].copy_from_slice(&seq.to_be_bytes());
    let ticks = u32::from_be_bytes([p[4], p[5], p[6], p[7]]);
    let per_frame = (FRAME.as_micros() * 90 / 1000) as u32;
    p[4..8].copy_from_slice(&ticks.wrapping_add(round * frames * per_frame).to_be_bytes());
    p
}

/// Pushes the clip `rounds` times to every target, frame by frame together, while the
/// targets' plays last.
async fn push(targets: Vec<MediaTarget>, media: Media, state: Arc<DeviceState>, listener: Arc<TcpListener>) {
    let mut outs = Vec::new();
    for target in &targets {
        state.pushing.lock().unwrap().push(target.call_id.clone());
        let to: SocketAddr = format!("{}:{}", target.ip, target.port).parse().unwrap();
        let out = match target.transport {
            MediaTransport::Udp => Out::Udp(UdpSocket::bind("127.0.0.1:0").await.unwrap(), to),
            MediaTransport::TcpPassive => Out::Tcp(
                TcpStream::connect(to)
                    .await
                    .expect("the server's media port listens"),
            ),
            MediaTransport::TcpActive => {
                let accepted = tokio::time::timeout(Duration::from_secs(10), listener.accept()).await;
                Out::Tcp(
                    accepted
                        .expect("the server connects for TCP active media")
                        .unwrap()
                        .0,
                )
            }
        };
        outs.push((
            target.call_id.clone(),
            packetize(&media.frames, target.ssrc, media.impairment),
            out,
        ));
    }
    let playing = |call_id: &str| state.pushing.lock().unwrap().iter().any(|c| c == call_id);
    let mut next_report = 0;
    let started = tokio::time::Instant::now();
    let count = outs[0].1.len();
    let per_round = media.frames.len() as u32;
    for (round, i) in (0..media.rounds).flat_map(|round| (0..count).map(move |i| (round, i))) {
        let frame = outs[0].1[i].0 as u32 + round * per_round;
        tokio::time::sleep_until(started + FRAME * frame).await;
        for (call_id, packets, out) in &mut outs {
            if !playing(call_id) {
                return;
            }
            let Some((_, packet)) = packets.get(i) else {
                continue;
            };
            let packet = &next_round(packet, round, packets.len(), per_round);
            if let Some(behind) = media.clock_behind.filter(|_| frame >= next_report) {
                let report = sender_report(packet, behind);
                send(out, &report, true).await;
            }
            if !send(out, packet, false).await {
                return;
            }
        }
        if frame >= next_report {
            next_report = frame + 25;
        }
    }
}

/// A sender report for the frame `packet` starts: its RTP timestamp is now, on a clock
/// `behind` the real one.
fn sender_report(packet: &[u8], behind: Duration) -> Vec<u8> {
    let ssrc = u32::from_be_bytes([packet[8], packet[9], packet[10], packet[11]]);
    encode_sender_report(
        &SenderReport {
            ssrc,
            wall: SystemTime::now() - behind,
            rtp_timestamp: u32::from_be_bytes([packet[4], packet[5], packet[6], packet[7]]),
        },
        0,
        0,
    )
}

enum Out {
    Udp(UdpSocket, SocketAddr),
    Tcp(TcpStream),
}

/// Sends one packet (RTCP over UDP to the port after RTP's); false once a TCP peer is gone.
async fn send(out: &mut Out, packet: &[u8], rtcp: bool) -> bool {
    match out {
        Out::Udp(socket, to) => {
            let to = SocketAddr::new(to.ip(), to.port() + u16::from(rtcp));
            let _ = socket.send_to(packet, to).await;
            true
        }
        Out::Tcp(stream) => {
            let len = (packet.len() as u16).to_be_bytes();
            stream.write_all(&len).await.is_ok() && stream.write_all(packet).await.is_ok()
        }
    }
}
