//! A throwaway certificate authority for the TLS tests: a CA, and a server certificate it
//! signed for 127.0.0.1, written as PEM files for peers (mosquitto) and for the sinks'
//! `ca_file`.

use std::path::PathBuf;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::TempDir;

pub struct TestCa {
    dir: TempDir,
    server_chain: Vec<CertificateDer<'static>>,
    server_key_pem: String,
}

impl TestCa {
    pub fn new() -> Self {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "Peregrine test CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let server_key = KeyPair::generate().unwrap();
        let mut server_params = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        server_params
            .distinguished_name
            .push(DnType::CommonName, "127.0.0.1");
        let server = server_params.signed_by(&server_key, &ca, &ca_key).unwrap();
        let dir = TempDir::new("tls");
        std::fs::write(dir.0.join("ca.pem"), ca.pem()).unwrap();
        std::fs::write(dir.0.join("server.pem"), server.pem()).unwrap();
        std::fs::write(dir.0.join("server.key"), server_key.serialize_pem()).unwrap();
        Self {
            dir,
            server_chain: vec![server.der().clone()],
            server_key_pem: server_key.serialize_pem(),
        }
    }

    pub fn ca_file(&self) -> PathBuf {
        self.dir.0.join("ca.pem")
    }

    pub fn server_cert_file(&self) -> PathBuf {
        self.dir.0.join("server.pem")
    }

    pub fn server_key_file(&self) -> PathBuf {
        self.dir.0.join("server.key")
    }

    /// A TLS acceptor presenting the server certificate.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let key = PrivateKeyDer::from_pem_slice(self.server_key_pem.as_bytes()).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(self.server_chain.clone(), key)
        .unwrap();
        tokio_rustls::TlsAcceptor::from(Arc::new(config))
    }
}
