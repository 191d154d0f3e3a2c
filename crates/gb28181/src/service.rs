//! The GB28181 SIP server: one UDP socket and one TCP listener on the same port, and one
//! task that owns the [`Signalling`] state. Sockets and connection tasks only move bytes
//! to and from that task; streams and the API reach it through a [`Gb28181`] handle with
//! commands that carry their reply channel.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::framing::{self, Frame};
use crate::signalling::{
    DeviceSummary, Outgoing, Peer, Play, PlayError, PlayRequest, Signalling, SignallingConfig,
};

/// How often time is looked at: keepalive loss, INVITE resends and answer timeouts, BYEs
/// for streams that let go. Their own scales are seconds.
const TICK: Duration = Duration::from_millis(250);
/// Commands queued for the signalling task; a caller waits for room when it is full.
const COMMANDS: usize = 64;
/// Messages from TCP connections queued for the task; a reader waits when it is full (and
/// so stops reading its connection: TCP's own flow control pushes back on the device).
const INBOUND: usize = 256;
/// Messages queued to one TCP connection; past it the message is dropped with a warning
/// (a device that does not read its connection will retransmit or re-register).
const OUTBOUND_PER_CONNECTION: usize = 64;
/// TCP connections at once; more wait in the kernel's backlog.
const MAX_CONNECTIONS: usize = 4096;
/// The largest SIP datagram taken.
const MAX_DATAGRAM: usize = 65_535;

/// The SIP server's settings.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Where SIP is received, on UDP and TCP alike.
    pub listen: SocketAddr,
    pub signalling: SignallingConfig,
}

enum Command {
    Play(PlayRequest, oneshot::Sender<Result<Play, PlayError>>),
    Devices(oneshot::Sender<Vec<DeviceSummary>>),
}

enum Inbound {
    Connected(SocketAddr, mpsc::Sender<Vec<u8>>),
    Message(SocketAddr, Vec<u8>),
    Closed(SocketAddr),
}

/// A handle on the running SIP server. Cheap to clone; the server stops when the last
/// handle is gone.
#[derive(Debug, Clone)]
pub struct Gb28181 {
    commands: mpsc::Sender<Command>,
    sip_address: SocketAddr,
}

impl Gb28181 {
    /// Binds UDP and TCP on `config.listen` and starts the server.
    /// With port 0 the system picks one, and requests say that one.
    pub async fn start(mut config: ServiceConfig) -> std::io::Result<Gb28181> {
        let udp = UdpSocket::bind(config.listen).await?;
        let sip_address = udp.local_addr()?;
        let local = &mut config.signalling.registrar.local;
        if local.port == 0 {
            local.port = sip_address.port();
        }
        // The same port on TCP (an ephemeral UDP port, as tests ask, is taken on TCP too).
        let tcp = TcpListener::bind(sip_address).await?;
        let (commands, commands_rx) = mpsc::channel(COMMANDS);
        let (inbound, inbound_rx) = mpsc::channel(INBOUND);
        tokio::spawn(accept(tcp, inbound));
        let state = Signalling::new(config.signalling);
        tokio::spawn(run(state, udp, commands_rx, inbound_rx));
        tracing::info!(address = %sip_address, "GB28181 SIP listening (UDP and TCP)");
        Ok(Gb28181 {
            commands,
            sip_address,
        })
    }

    /// Where SIP is received.
    pub fn sip_address(&self) -> SocketAddr {
        self.sip_address
    }

    /// Invites a channel to push to `request.media_port`; resolves with the device's answer.
    pub async fn play(&self, request: PlayRequest) -> Result<Play, PlayError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Play(request, reply))
            .await
            .map_err(|_| PlayError::Stopped)?;
        answer.await.map_err(|_| PlayError::Stopped)?
    }

    /// Every registered device; empty once the server has stopped.
    pub async fn devices(&self) -> Vec<DeviceSummary> {
        let (reply, answer) = oneshot::channel();
        if self.commands.send(Command::Devices(reply)).await.is_err() {
            return Vec::new();
        }
        answer.await.unwrap_or_default()
    }
}

/// The owner task: every input goes through the state; what it returns is sent.
async fn run(
    mut state: Signalling,
    udp: UdpSocket,
    mut commands: mpsc::Receiver<Command>,
    mut inbound: mpsc::Receiver<Inbound>,
) {
    let mut connections: HashMap<SocketAddr, mpsc::Sender<Vec<u8>>> = HashMap::new();
    let mut buf = vec![0; MAX_DATAGRAM];
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let out = tokio::select! {
            received = udp.recv_from(&mut buf) => match received {
                Ok((n, from)) => state.on_message(&buf[..n], Peer::Udp(from), Instant::now()),
                // ICMP port-unreachable from an earlier send shows up here on Linux.
                Err(e) => {
                    tracing::debug!(error = %e, "SIP UDP receive failed");
                    continue;
                }
            },
            // The accept task holds a sender for as long as the server runs.
            Some(message) = inbound.recv() => match message {
                Inbound::Connected(peer, writer) => {
                    connections.insert(peer, writer);
                    continue;
                }
                Inbound::Closed(peer) => {
                    connections.remove(&peer);
                    continue;
                }
                Inbound::Message(peer, bytes) => state.on_message(&bytes, Peer::Tcp(peer), Instant::now()),
            },
            command = commands.recv() => match command {
                Some(Command::Play(request, reply)) => state.play(request, reply, Instant::now()),
                Some(Command::Devices(reply)) => {
                    let _ = reply.send(state.devices(Instant::now()));
                    continue;
                }
                // Every handle is gone: the server is shutting down.
                None => break,
            },
            _ = tick.tick() => state.tick(Instant::now()),
        };
        for Outgoing { to, bytes } in out {
            deliver(&udp, &connections, to, bytes).await;
        }
    }
    tracing::info!("GB28181 SIP server stopped");
}

async fn deliver(
    udp: &UdpSocket,
    connections: &HashMap<SocketAddr, mpsc::Sender<Vec<u8>>>,
    to: Peer,
    bytes: Vec<u8>,
) {
    match to {
        Peer::Udp(address) => {
            if let Err(e) = udp.send_to(&bytes, address).await {
                tracing::debug!(%address, error = %e, "SIP UDP send failed");
            }
        }
        Peer::Tcp(address) => match connections.get(&address) {
            Some(writer) => {
                if writer.try_send(bytes).is_err() {
                    tracing::warn!(%address, "SIP TCP connection not reading or gone; message dropped");
                }
            }
            None => tracing::warn!(%address, "SIP TCP connection closed; message dropped"),
        },
    }
}

async fn accept(listener: TcpListener, inbound: mpsc::Sender<Inbound>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: wait rather than spin.
                tracing::warn!(error = %e, "SIP TCP accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let inbound = inbound.clone();
        tokio::spawn(async move {
            connection(stream, peer, inbound).await;
            drop(permit);
        });
    }
}

async fn connection(stream: TcpStream, peer: SocketAddr, inbound: mpsc::Sender<Inbound>) {
    let _ = stream.set_nodelay(true);
    let (reader, writer) = stream.into_split();
    let (tx, rx) = mpsc::channel(OUTBOUND_PER_CONNECTION);
    if inbound.send(Inbound::Connected(peer, tx)).await.is_err() {
        return;
    }
    let writing = tokio::spawn(write(writer, rx));
    if let Err(e) = read(reader, peer, &inbound).await {
        tracing::info!(%peer, error = %e, "SIP TCP connection dropped");
    }
    let _ = inbound.send(Inbound::Closed(peer)).await;
    writing.abort();
}

async fn read(
    mut reader: OwnedReadHalf,
    peer: SocketAddr,
    inbound: &mpsc::Sender<Inbound>,
) -> Result<(), String> {
    let mut buf = BytesMut::with_capacity(8 << 10);
    loop {
        match framing::next_frame(&buf).map_err(|e| e.to_string())? {
            Frame::Message { start, end } => {
                let message = buf[start..end].to_vec();
                buf.advance(end);
                if inbound.send(Inbound::Message(peer, message)).await.is_err() {
                    return Ok(());
                }
                continue;
            }
            Frame::Partial { skip } => buf.advance(skip),
        }
        if reader.read_buf(&mut buf).await.map_err(|e| e.to_string())? == 0 {
            return Ok(());
        }
    }
}

async fn write(mut writer: OwnedWriteHalf, mut queue: mpsc::Receiver<Vec<u8>>) {
    while let Some(bytes) = queue.recv().await {
        if writer.write_all(&bytes).await.is_err() {
            return;
        }
    }
}
