//! TLS for the HTTP and gRPC listeners.
//!
//! - [`CertificateFiles`]: the PEM files (certificate chain, private key, optionally the CA
//!   that client certificates must chain to, which turns on mutual TLS).
//! - [`ReloadingConfig`]: the rustls server configurations those files make (one per
//!   [`Protocol`], differing only in ALPN), rebuilt when any of them changes. New connections get the new certificate; connections already open keep
//!   the one they shook hands with, so a renewal drops nobody. A file that fails to load
//!   (half-written, wrong key) leaves the previous configuration serving and is reported.
//! - [`TlsListener`]: accepts TCP connections and runs each handshake in a task of its own
//!   (bounded by a timeout and by a cap on handshakes in progress), so a client that stalls
//!   its handshake holds only its own task, never the accept loop. Finished connections are
//!   handed to axum (as its `Listener`) or to tonic (as a stream of [`GrpcTlsStream`]).

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::server::TlsStream;

/// Handshakes in progress at once per listener; beyond it, accepted connections wait for a
/// slot (the kernel's backlog holds the rest).
const MAX_HANDSHAKES: usize = 512;

/// Connections whose handshake is done but which the server has not taken yet.
const READY_QUEUE: usize = 64;

/// The PEM files of a TLS listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateFiles {
    /// The server's certificate chain, leaf first.
    pub cert: PathBuf,
    /// The private key of the leaf (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// CA certificates that client certificates must chain to; given, every client must
    /// present one (mutual TLS).
    pub client_ca: Option<PathBuf>,
}

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("TLS {what} {path}: {reason}")]
    File {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("TLS: {0}")]
    Config(String),
}

fn file_error(what: &'static str, path: &Path, reason: impl ToString) -> TlsError {
    TlsError::File {
        what,
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

fn certificates(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|e| file_error(what, path, e))?;
    if certs.is_empty() {
        return Err(file_error(what, path, "no PEM certificate in it"));
    }
    Ok(certs)
}

/// What a listener serves over TLS, which decides the ALPN protocols it offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// axum's HTTP/1.1.
    Http1,
    /// gRPC: HTTP/2 only, and gRPC clients insist on negotiating it.
    Grpc,
}

impl Protocol {
    fn alpn(self) -> Vec<Vec<u8>> {
        match self {
            Protocol::Http1 => vec![b"http/1.1".to_vec()],
            Protocol::Grpc => vec![b"h2".to_vec()],
        }
    }
}

impl CertificateFiles {
    /// The server configuration these files make (no ALPN). Every problem names the file
    /// and what is wrong with it.
    pub fn server_config(&self) -> Result<ServerConfig, TlsError> {
        // The provider is named rather than taken from the process default, which depends on
        // which rustls features other crates happen to enable (the sinks name the same one).
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                let (added, ignored) = roots.add_parsable_certificates(certificates("client_ca", ca)?);
                if added == 0 {
                    return Err(file_error(
                        "client_ca",
                        ca,
                        format!("none of its {ignored} certificates is a usable CA certificate"),
                    ));
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .map_err(|e| file_error("client_ca", ca, e))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let chain = certificates("cert", &self.cert)?;
        let key = PrivateKeyDer::from_pem_file(&self.key).map_err(|e| file_error("key", &self.key, e))?;
        builder
            .with_single_cert(chain, key)
            .map_err(|e| TlsError::Config(format!("cert and key do not go together: {e}")))
    }

    fn paths(&self) -> impl Iterator<Item = &Path> {
        [Some(&self.cert), Some(&self.key), self.client_ca.as_ref()]
            .into_iter()
            .flatten()
            .map(PathBuf::as_path)
    }

    /// What identifies each file's current content without reading it: modification time
    /// and length (following symlinks, as Kubernetes swaps a Secret's files by relinking).
    fn stamps(&self) -> Vec<Option<(SystemTime, u64)>> {
        self.paths()
            .map(|p| {
                std::fs::metadata(p)
                    .ok()
                    .and_then(|m| Some((m.modified().ok()?, m.len())))
            })
            .collect()
    }
}

/// The server configurations of both protocols, following their files. The reload task
/// is their only writer; every handshake reads the current one of its listener.
pub struct ReloadingConfig {
    files: CertificateFiles,
    http1: ArcSwap<ServerConfig>,
    grpc: ArcSwap<ServerConfig>,
    /// The stamps the current configurations were built from.
    built_from: Mutex<Vec<Option<(SystemTime, u64)>>>,
}

/// `config` offering `protocol`'s ALPN.
fn for_protocol(config: &ServerConfig, protocol: Protocol) -> Arc<ServerConfig> {
    let mut config = config.clone();
    config.alpn_protocols = protocol.alpn();
    Arc::new(config)
}

impl ReloadingConfig {
    /// Loads the files now; an error here is the server's start-up error.
    pub fn load(files: CertificateFiles) -> Result<Arc<Self>, TlsError> {
        let stamps = files.stamps();
        let config = files.server_config()?;
        Ok(Arc::new(Self {
            files,
            http1: ArcSwap::new(for_protocol(&config, Protocol::Http1)),
            grpc: ArcSwap::new(for_protocol(&config, Protocol::Grpc)),
            built_from: Mutex::new(stamps),
        }))
    }

    pub fn current(&self, protocol: Protocol) -> Arc<ServerConfig> {
        match protocol {
            Protocol::Http1 => self.http1.load_full(),
            Protocol::Grpc => self.grpc.load_full(),
        }
    }

    /// Rebuilds the configuration if a file changed since the last build: `Ok(true)` when
    /// it did, `Ok(false)` when nothing changed, the error (and the old configuration kept)
    /// when the new files do not make one. A failed build is retried at the next change.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let stamps = self.files.stamps();
        let mut built_from = self.built_from.lock().unwrap_or_else(|e| e.into_inner());
        if *built_from == stamps {
            return Ok(false);
        }
        *built_from = stamps;
        let config = self.files.server_config()?;
        self.http1.store(for_protocol(&config, Protocol::Http1));
        self.grpc.store(for_protocol(&config, Protocol::Grpc));
        Ok(true)
    }
}

/// Checks `config`'s files for a change every `interval`, for as long as the server runs.
pub fn spawn_reloader(config: Arc<ReloadingConfig>, interval: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            match config.reload_if_changed() {
                Ok(true) => tracing::info!(
                    cert = %config.files.cert.display(),
                    "TLS certificate files changed; new connections use the new ones"
                ),
                Ok(false) => {}
                Err(e) => tracing::warn!(
                    error = %e,
                    "TLS certificate files changed but do not load; still serving the previous ones"
                ),
            }
        }
    })
}

/// A TCP listener whose connections come out TLS-terminated.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Starts accepting `protocol` on `tcp`. The accept task stops when the listener is
    /// dropped.
    pub fn new(
        tcp: TcpListener,
        config: Arc<ReloadingConfig>,
        protocol: Protocol,
        handshake_timeout: Duration,
    ) -> io::Result<Self> {
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(READY_QUEUE);
        tokio::spawn(accept_loop(tcp, (config, protocol), handshake_timeout, tx));
        Ok(Self { ready, local })
    }

    /// The connections as tonic takes them.
    pub fn into_grpc_incoming(self) -> impl tokio_stream::Stream<Item = io::Result<GrpcTlsStream>> {
        use tokio_stream::StreamExt as _;
        tokio_stream::wrappers::ReceiverStream::new(self.ready).map(|(stream, _)| Ok(GrpcTlsStream(stream)))
    }
}

async fn accept_loop(
    tcp: TcpListener,
    (config, protocol): (Arc<ReloadingConfig>, Protocol),
    handshake_timeout: Duration,
    ready: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        let accepted = tokio::select! {
            accepted = tcp.accept() => accepted,
            () = ready.closed() => return,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: back off rather than spin.
                tracing::warn!(error = %e, "accepting a TLS connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Small responses go out at once rather than waiting on a delayed ACK (Nagle).
        let _ = stream.set_nodelay(true);
        let Ok(permit) = handshakes.clone().acquire_owned().await else {
            return;
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(config.current(protocol));
        let ready = ready.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => {
                    let _ = ready.send((tls, peer)).await;
                }
                Ok(Err(e)) => {
                    metrics::counter!(HANDSHAKE_FAILURES, "reason" => "error").increment(1);
                    tracing::info!(%peer, error = %e, "TLS handshake failed");
                }
                Err(_) => {
                    metrics::counter!(HANDSHAKE_FAILURES, "reason" => "timeout").increment(1);
                    tracing::info!(%peer, seconds = handshake_timeout.as_secs_f64(), "TLS handshake timed out");
                }
            }
        });
    }
}

/// Failed TLS handshakes, by reason (`error`, `timeout`).
pub const HANDSHAKE_FAILURES: &str = "peregrine_tls_handshake_failures_total";

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accept task ended only because this listener is going away.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// A TLS connection as tonic serves it (tonic's own impl needs its TLS features, which
/// would bring a second configuration path).
pub struct GrpcTlsStream(TlsStream<TcpStream>);

impl tonic::transport::server::Connected for GrpcTlsStream {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.0.get_ref().0.connect_info()
    }
}

impl AsyncRead for GrpcTlsStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for GrpcTlsStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}

#[cfg(test)]
#[path = "tls_tests.rs"]
mod tests;
