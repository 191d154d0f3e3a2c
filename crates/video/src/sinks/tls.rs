//! TLS for the sinks' peers (an MQTT broker, webhook endpoints): one rustls client
//! configuration built from a sink's settings. Servers are verified against the bundled
//! Mozilla roots (webpki-roots, so a fresh machine without a CA store works) plus the CA
//! file given, which is how a private broker's certificate is trusted; verification is
//! never turned off.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

/// The certificate files a sink's TLS may use; every one optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM file of CA certificates trusted besides the bundled public roots.
    pub ca_file: Option<PathBuf>,
    /// PEM certificate chain presented to the server (mutual TLS); needs `client_key_file`.
    pub client_cert_file: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of `client_cert_file`.
    pub client_key_file: Option<PathBuf>,
}

impl TlsFiles {
    pub fn is_empty(&self) -> bool {
        self.ca_file.is_none() && self.client_cert_file.is_none() && self.client_key_file.is_none()
    }
}

fn certificates(what: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{what} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{what} {}: no PEM certificate in it", path.display()));
    }
    Ok(certs)
}

/// The client configuration `files` describe; every problem names the file and what is
/// wrong with it.
pub fn client_config(files: &TlsFiles) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(ca) = &files.ca_file {
        let (added, ignored) = roots.add_parsable_certificates(certificates("ca_file", ca)?);
        if added == 0 {
            return Err(format!(
                "ca_file {}: none of its {ignored} certificates is a usable CA certificate",
                ca.display()
            ));
        }
    }
    // The provider is named rather than taken from the process default, which depends on
    // which rustls features other crates happen to enable.
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots);
    let config = match (&files.client_cert_file, &files.client_key_file) {
        (None, None) => builder.with_no_client_auth(),
        (Some(cert), Some(key)) => {
            let chain = certificates("client_cert_file", cert)?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| format!("client_key_file {}: {e}", key.display()))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("client_cert_file and client_key_file do not go together: {e}"))?
        }
        _ => return Err("client_cert_file and client_key_file must be given together".into()),
    };
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str, contents: &[u8]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("peregrine-tls-{}-{name}", std::process::id()));
        std::fs::write(&dir, contents).unwrap();
        dir
    }

    #[test]
    fn public_roots_alone_make_a_config() {
        assert!(client_config(&TlsFiles::default()).is_ok());
    }

    #[test]
    fn bad_files_are_named_in_the_error() {
        let missing = TlsFiles {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..TlsFiles::default()
        };
        let err = client_config(&missing).unwrap_err();
        assert!(err.starts_with("ca_file /nonexistent/ca.pem:"), "{err}");

        let not_pem = temp("not-pem", b"hello");
        let err = client_config(&TlsFiles {
            ca_file: Some(not_pem.clone()),
            ..TlsFiles::default()
        })
        .unwrap_err();
        assert!(err.contains("no PEM certificate"), "{err}");

        let err = client_config(&TlsFiles {
            client_cert_file: Some(not_pem.clone()),
            ..TlsFiles::default()
        })
        .unwrap_err();
        assert!(err.contains("must be given together"), "{err}");
        std::fs::remove_file(not_pem).unwrap();
    }
}
