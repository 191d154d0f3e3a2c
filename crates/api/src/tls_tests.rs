use std::sync::Arc;
use std::time::Duration;

use axum::serve::Listener as _;
use rcgen::{BasicConstraints, Certificate, CertificateParams, DnType, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;

/// A throwaway CA and a directory to write certificates into.
struct Pki {
    dir: PathBuf,
    ca_key: KeyPair,
    ca: Certificate,
    ca_pem: String,
}

impl Pki {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("peregrine-tls-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(DnType::CommonName, "test CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let ca_pem = ca.pem();
        std::fs::write(dir.join("ca.pem"), &ca_pem).unwrap();
        Self {
            dir,
            ca_key,
            ca,
            ca_pem,
        }
    }

    /// A leaf for `name` signed by the CA, as (certificate PEM, key PEM).
    fn leaf(&self, name: &str) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        let leaf = params.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        (leaf.pem(), key.serialize_pem())
    }

    /// Writes a server leaf named `name` as server.pem / server.key.
    fn write_server(&self, name: &str) {
        let (cert, key) = self.leaf(name);
        std::fs::write(self.dir.join("server.pem"), cert).unwrap();
        std::fs::write(self.dir.join("server.key"), key).unwrap();
    }

    fn files(&self, mutual: bool) -> CertificateFiles {
        CertificateFiles {
            cert: self.dir.join("server.pem"),
            key: self.dir.join("server.key"),
            client_ca: mutual.then(|| self.dir.join("ca.pem")),
        }
    }

    fn client(&self, identity: Option<(String, String)>) -> tokio_rustls::TlsConnector {
        let mut roots = RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(self.ca_pem.as_bytes()).unwrap())
            .unwrap();
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
        let config = match identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => builder
                .with_client_auth_cert(
                    vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()],
                    PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
                )
                .unwrap(),
        };
        tokio_rustls::TlsConnector::from(Arc::new(config))
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A fresh TLS connection to the echo server at `addr`, checked with one round trip.
async fn connect(
    connector: &tokio_rustls::TlsConnector,
    addr: SocketAddr,
) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let mut tls = connector
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await?;
    // TLS 1.3 reports a refused client certificate only at the first read.
    tls.write_all(b"ping").await?;
    let mut buf = [0u8; 4];
    tls.read_exact(&mut buf).await?;
    assert_eq!(&buf, b"ping");
    Ok(tls)
}

fn leaf_name(tls: &tokio_rustls::client::TlsStream<TcpStream>) -> String {
    // Which of the test's leaf names the certificate shown carries (they appear in the DER
    // as plain text).
    let der = &tls.get_ref().1.peer_certificates().unwrap()[0];
    let text = String::from_utf8_lossy(der.as_ref()).into_owned();
    ["first", "second", "third"]
        .into_iter()
        .find(|n| text.contains(n))
        .unwrap_or("?")
        .to_string()
}

/// Serves `listener`: every connection echoes what it reads.
fn echo(mut listener: TlsListener) {
    tokio::spawn(async move {
        loop {
            let (mut tls, _) = listener.accept().await;
            tokio::spawn(async move {
                let mut buf = [0u8; 64];
                while let Ok(n) = tls.read(&mut buf).await {
                    if n == 0 || tls.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
}

async fn listen(config: Arc<ReloadingConfig>, protocol: Protocol, timeout: Duration) -> SocketAddr {
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let listener = TlsListener::new(tcp, config, protocol, timeout).unwrap();
    let addr = listener.local_addr().unwrap();
    echo(listener);
    addr
}

#[tokio::test]
async fn changed_files_serve_new_connections_while_open_ones_keep_working() {
    let pki = Pki::new("reload");
    pki.write_server("first");
    let config = ReloadingConfig::load(pki.files(false)).unwrap();
    let addr = listen(config.clone(), Protocol::Http1, Duration::from_secs(5)).await;
    let client = pki.client(None);
    let mut open = connect(&client, addr).await.unwrap();
    assert_eq!(leaf_name(&open), "first");
    assert!(!config.reload_if_changed().unwrap(), "nothing changed yet");

    pki.write_server("second");
    assert!(config.reload_if_changed().unwrap());
    assert_eq!(leaf_name(&connect(&client, addr).await.unwrap()), "second");
    // The connection made before the renewal is still served.
    open.write_all(b"pong").await.unwrap();
    let mut buf = [0u8; 4];
    open.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"pong");

    // A broken key (a half-written renewal) keeps the last good certificate serving.
    std::fs::write(pki.dir.join("server.key"), "not a key").unwrap();
    let err = config.reload_if_changed().unwrap_err().to_string();
    assert!(err.contains("server.key"), "{err}");
    assert_eq!(leaf_name(&connect(&client, addr).await.unwrap()), "second");
    pki.write_server("third");
    assert!(config.reload_if_changed().unwrap());
    assert_eq!(leaf_name(&connect(&client, addr).await.unwrap()), "third");
}

#[tokio::test]
async fn with_a_client_ca_only_clients_with_a_certificate_it_signed_get_in() {
    let pki = Pki::new("mutual");
    pki.write_server("first");
    let config = ReloadingConfig::load(pki.files(true)).unwrap();
    assert_eq!(
        config.current(Protocol::Grpc).alpn_protocols,
        vec![b"h2".to_vec()]
    );
    assert_eq!(
        config.current(Protocol::Http1).alpn_protocols,
        vec![b"http/1.1".to_vec()]
    );
    let addr = listen(config, Protocol::Grpc, Duration::from_secs(5)).await;
    assert!(
        connect(&pki.client(None), addr).await.is_err(),
        "no client certificate"
    );
    let stranger = Pki::new("stranger");
    assert!(
        connect(&pki.client(Some(stranger.leaf("x"))), addr)
            .await
            .is_err(),
        "a certificate of another CA"
    );
    connect(&pki.client(Some(pki.leaf("client"))), addr)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_stalled_handshake_neither_blocks_others_nor_stays_open() {
    let pki = Pki::new("stall");
    pki.write_server("first");
    let config = ReloadingConfig::load(pki.files(false)).unwrap();
    let addr = listen(config, Protocol::Http1, Duration::from_millis(300)).await;
    let mut stalled = TcpStream::connect(addr).await.unwrap();
    stalled.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
    connect(&pki.client(None), addr).await.unwrap();
    // The server gives up on the silent client after the handshake timeout.
    let mut buf = [0u8; 16];
    let closed = tokio::time::timeout(Duration::from_secs(10), stalled.read(&mut buf)).await;
    assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
}

#[test]
fn every_bad_file_is_named_with_what_is_wrong() {
    let pki = Pki::new("bad");
    pki.write_server("first");
    let mut files = pki.files(false);
    files.cert = pki.dir.join("missing.pem");
    let err = files.server_config().unwrap_err().to_string();
    assert!(err.contains("TLS cert") && err.contains("missing.pem"), "{err}");

    std::fs::write(pki.dir.join("empty.pem"), "").unwrap();
    files.cert = pki.dir.join("empty.pem");
    let err = files.server_config().unwrap_err().to_string();
    assert!(err.contains("no PEM certificate"), "{err}");

    // A key of another certificate.
    let (cert, _) = pki.leaf("other");
    std::fs::write(pki.dir.join("other.pem"), cert).unwrap();
    files.cert = pki.dir.join("other.pem");
    let err = files.server_config().unwrap_err().to_string();
    assert!(err.contains("cert and key do not go together"), "{err}");

    let mut files = pki.files(false);
    files.client_ca = Some(pki.dir.join("server.key"));
    let err = files.server_config().unwrap_err().to_string();
    assert!(err.contains("TLS client_ca"), "{err}");
}
