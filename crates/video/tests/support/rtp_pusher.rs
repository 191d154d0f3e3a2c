//! A simulated GB28181 camera: a clip muxed into MPEG-PS by a real muxer (GStreamer's
//! `mpegpsmux`), cut into frames, packetized into RTP here (payload type 96, 90 kHz
//! timestamps from each frame's PTS, the marker on a frame's last packet) and pushed over
//! UDP or TCP (RFC 4571 framing), with some packets swapped and a few dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::time::Instant;

/// RTP payload bytes per packet (a typical camera's, under a 1,500-byte MTU).
const PAYLOAD: usize = 1_400;

/// `clip` (an H.264 mp4) as MPEG-PS in `dir`, muxed by GStreamer's mpegpsmux.
pub fn mux_ps(clip: &Path, dir: &Path) -> PathBuf {
    let out = dir.join("clip.ps");
    let status = Command::new("gst-launch-1.0")
        .arg("-q")
        .args([
            "filesrc",
            &format!("location={}", clip.display()),
            "!",
            "qtdemux",
            "!",
            "h264parse",
        ])
        .args([
            "!",
            "mpegpsmux",
            "!",
            "filesink",
            &format!("location={}", out.display()),
        ])
        .status()
        .expect("run gst-launch-1.0 (scripts/setup-test.sh installs GStreamer)");
    assert!(status.success(), "mpegpsmux failed: {status}");
    out
}

/// One frame's share of the program stream: everything up to and including its video PES.
pub struct PsFrame {
    pub bytes: Vec<u8>,
    pub pts_90k: u64,
}

/// Cuts a program stream into frames: pack headers, system headers and PSMs go with the
/// video PES that follows them (the muxer writes one PES per frame, each with a PTS).
pub fn ps_frames(ps: &[u8]) -> Vec<PsFrame> {
    let mut frames = Vec::new();
    let (mut i, mut start) = (0, 0);
    while i + 6 <= ps.len() {
        assert_eq!(ps[i..i + 3], [0, 0, 1], "a unit starts at {i}");
        let id = ps[i + 3];
        let len = match id {
            0xBA => 14 + usize::from(ps[i + 13] & 7),
            0xB9 => 4,
            _ => 6 + usize::from(u16::from_be_bytes([ps[i + 4], ps[i + 5]])),
        };
        if (0xE0..=0xEF).contains(&id) && ps[i + 7] & 0x80 != 0 {
            let p = &ps[i + 9..i + 14];
            let pts = (u64::from(p[0] >> 1) & 7) << 30
                | u64::from(p[1]) << 22
                | u64::from(p[2] >> 1) << 15
                | u64::from(p[3]) << 7
                | u64::from(p[4] >> 1);
            frames.push(PsFrame {
                bytes: ps[start..i + len].to_vec(),
                pts_90k: pts,
            });
            start = i + len;
        }
        i += len;
    }
    frames
}

/// How the pusher damages its stream.
#[derive(Debug, Clone, Copy)]
pub struct Impairment {
    /// Every `swap_every`-th packet is sent after the one following it.
    pub swap_every: usize,
    /// Packet numbers (counted from 0) never sent.
    pub drop: &'static [usize],
}

/// RTP packets of `frames`, in send order (impaired), each with the frame it belongs to.
pub fn packetize(frames: &[PsFrame], ssrc: u32, impairment: Impairment) -> Vec<(usize, Vec<u8>)> {
    let base_ts = 0xFFFF_0000u32; // wraps within the first second
    let mut packets = Vec::new();
    let mut seq = 0xFF00u16; // wraps too
    for (n, frame) in frames.iter().enumerate() {
        let chunks: Vec<&[u8]> = frame.bytes.chunks(PAYLOAD).collect();
        for (k, chunk) in chunks.iter().enumerate() {
            let mut p = vec![0x80, 96 | if k + 1 == chunks.len() { 0x80 } else { 0 }];
            p.extend_from_slice(&seq.to_be_bytes());
            p.extend_from_slice(&base_ts.wrapping_add(frame.pts_90k as u32).to_be_bytes());
            p.extend_from_slice(&ssrc.to_be_bytes());
            p.extend_from_slice(chunk);
            packets.push((n, p));
            seq = seq.wrapping_add(1);
        }
    }
    let mut sent: Vec<(usize, Vec<u8>)> = packets
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !impairment.drop.contains(i))
        .map(|(_, p)| p)
        .collect();
    let mut i = impairment.swap_every;
    while impairment.swap_every > 0 && i + 1 < sent.len() {
        sent.swap(i, i + 1);
        i += impairment.swap_every;
    }
    sent
}

/// Where the pusher sends.
pub enum Link {
    Udp(std::net::SocketAddr),
    /// We connect to the server (it listens: "TCP passive" on its side).
    TcpConnect(std::net::SocketAddr),
    /// The server connects to us ("TCP active" on its side).
    TcpListen(TcpListener),
}

/// Sends the packets at the clip's rate (frame `n` at `n * frame_interval`), until
/// `stop` says so or the packets run out; returns how many were sent.
pub async fn push(
    link: Link,
    packets: &[(usize, Vec<u8>)],
    frame_interval: Duration,
    stop: impl Fn() -> bool,
) -> usize {
    enum Out {
        Udp(UdpSocket, std::net::SocketAddr),
        Tcp(TcpStream),
    }
    let mut out = match link {
        Link::Udp(to) => {
            // Datagrams sent before the server binds are lost: wait until the port is taken.
            let started = Instant::now();
            while std::net::UdpSocket::bind(to).is_ok() {
                assert!(
                    started.elapsed() < Duration::from_secs(20),
                    "the server never bound {to}"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Out::Udp(UdpSocket::bind("127.0.0.1:0").await.expect("udp socket"), to)
        }
        Link::TcpConnect(to) => {
            // The server binds when the stream starts: try until it listens.
            let started = Instant::now();
            loop {
                match TcpStream::connect(to).await {
                    Ok(s) => break Out::Tcp(s),
                    Err(e) => {
                        assert!(
                            started.elapsed() < Duration::from_secs(20),
                            "server never listened: {e}"
                        );
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
        }
        Link::TcpListen(listener) => Out::Tcp(listener.accept().await.expect("server connects").0),
    };
    let started = Instant::now();
    let mut sent = 0;
    for (frame, packet) in packets {
        if stop() {
            break;
        }
        tokio::time::sleep_until(started + frame_interval * (*frame as u32)).await;
        match &mut out {
            Out::Udp(socket, to) => {
                socket.send_to(packet, *to).await.expect("udp send");
            }
            Out::Tcp(stream) => {
                let len = u16::try_from(packet.len()).expect("packet under 64 KiB");
                if stream.write_all(&len.to_be_bytes()).await.is_err()
                    || stream.write_all(packet).await.is_err()
                {
                    break;
                }
            }
        }
        sent += 1;
    }
    sent
}

/// Waits (polling, bounded) until the server has bound `port` on 127.0.0.1 (UDP or TCP):
/// found by failing to bind it ourselves, which, unlike connecting, takes nothing from a
/// listener that accepts one sender.
pub async fn wait_until_bound(port: u16, udp: bool) {
    let to = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let started = Instant::now();
    let free = || match udp {
        true => std::net::UdpSocket::bind(to).is_ok(),
        false => std::net::TcpListener::bind(to).is_ok(),
    };
    while free() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the server never bound {to}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A camera played by GStreamer: `clip` demuxed, then `payloader` and `sink` elements, at
/// the clip's own rate, started once the server has bound `port` (UDP when `udp`). Calling
/// what it returns kills it.
pub fn spawn_gst_pusher(
    clip: &Path,
    payloader: &[&str],
    sink: &[&str],
    port: u16,
    udp: bool,
) -> Box<dyn FnOnce() + Send> {
    let mut command = Command::new("gst-launch-1.0");
    command
        .arg("-q")
        .args([
            "filesrc",
            &format!("location={}", clip.display()),
            "!",
            "qtdemux",
            "!",
        ])
        .args(payloader)
        .arg("!")
        .args(sink)
        .stdout(Stdio::null());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        wait_until_bound(port, udp).await;
        let child = GstChild(
            command
                .spawn()
                .expect("run gst-launch-1.0 (scripts/setup-test.sh installs GStreamer)"),
        );
        let _ = stopped.await;
        drop(child);
    });
    Box::new(move || {
        let _ = stop.send(());
    })
}

/// Killed when dropped.
struct GstChild(Child);

impl Drop for GstChild {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
