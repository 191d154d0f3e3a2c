//! `[tls]` of the serve settings: HTTPS and gRPC over TLS from PEM files, reloaded when the
//! files change. Building the listeners' configurations happens here too.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use peregrine_api::tls::{CertificateFiles, ReloadingConfig};
use serde::Deserialize;

/// TLS, as the config file's `[tls]` section spells it. Off unless `cert` and `key` are set.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct TlsSettings {
    /// PEM certificate chain of the server, leaf first.
    pub cert: Option<PathBuf>,
    /// PEM private key of the leaf certificate.
    pub key: Option<PathBuf>,
    /// PEM CA certificates that client certificates must chain to: set, every client of
    /// both listeners must present one (mutual TLS).
    pub client_ca: Option<PathBuf>,
    /// How often the files are checked for a change, in seconds.
    pub reload_interval_s: f64,
    /// A client that has not finished its handshake by then is disconnected, in seconds.
    pub handshake_timeout_s: f64,
}

impl Default for TlsSettings {
    fn default() -> Self {
        Self {
            cert: None,
            key: None,
            client_ca: None,
            reload_interval_s: 5.0,
            handshake_timeout_s: 10.0,
        }
    }
}

/// Flags for [`TlsSettings`]; each overrides the config file.
#[derive(Debug, Args, Default)]
pub struct TlsArgs {
    /// PEM certificate chain: with --tls-key, HTTP and gRPC are served over TLS only.
    #[arg(long = "tls-cert", env = "PEREGRINE_TLS_CERT")]
    pub cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long = "tls-key", env = "PEREGRINE_TLS_KEY")]
    pub key: Option<PathBuf>,
    /// PEM CA certificates of the clients: every client must then present a certificate
    /// they signed (mutual TLS).
    #[arg(long = "tls-client-ca", env = "PEREGRINE_TLS_CLIENT_CA")]
    pub client_ca: Option<PathBuf>,
    /// Seconds between checks of the certificate files for a change [default: 5].
    #[arg(long = "tls-reload-interval-s", env = "PEREGRINE_TLS_RELOAD_INTERVAL_S")]
    pub reload_interval_s: Option<f64>,
}

impl TlsArgs {
    pub fn apply(self, s: &mut TlsSettings) {
        if self.cert.is_some() {
            s.cert = self.cert;
        }
        if self.key.is_some() {
            s.key = self.key;
        }
        if self.client_ca.is_some() {
            s.client_ca = self.client_ca;
        }
        if let Some(v) = self.reload_interval_s {
            s.reload_interval_s = v;
        }
    }
}

/// The listeners' configurations (a task follows their files).
pub struct ServerTls {
    pub config: Arc<ReloadingConfig>,
    pub handshake_timeout: Duration,
}

impl TlsSettings {
    pub fn validate(&self) -> Result<()> {
        anyhow::ensure!(
            self.cert.is_some() == self.key.is_some(),
            "tls: give both cert and key (--tls-cert, --tls-key), or neither"
        );
        anyhow::ensure!(
            self.client_ca.is_none() || self.cert.is_some(),
            "tls: client_ca needs cert and key: mutual TLS is TLS first"
        );
        for (name, v) in [
            ("reload_interval_s", self.reload_interval_s),
            ("handshake_timeout_s", self.handshake_timeout_s),
        ] {
            anyhow::ensure!(v.is_finite() && v > 0.0, "tls: {name} must be above 0, not {v}");
        }
        Ok(())
    }

    /// Loads the files and starts following them; `None` when TLS is off.
    pub fn start(&self) -> Result<Option<ServerTls>> {
        let (Some(cert), Some(key)) = (&self.cert, &self.key) else {
            return Ok(None);
        };
        let files = CertificateFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: self.client_ca.clone(),
        };
        let config = ReloadingConfig::load(files).context("loading the TLS files")?;
        peregrine_api::tls::spawn_reloader(config.clone(), Duration::from_secs_f64(self.reload_interval_s));
        Ok(Some(ServerTls {
            config,
            handshake_timeout: Duration::from_secs_f64(self.handshake_timeout_s),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_a_tls_setting_is_refused_with_the_way_out() {
        let only_cert = TlsSettings {
            cert: Some("c.pem".into()),
            ..Default::default()
        };
        let err = only_cert.validate().unwrap_err().to_string();
        assert!(err.contains("give both cert and key"), "{err}");
        let only_ca = TlsSettings {
            client_ca: Some("ca.pem".into()),
            ..Default::default()
        };
        assert!(only_ca
            .validate()
            .unwrap_err()
            .to_string()
            .contains("client_ca needs cert"));
        let zero = TlsSettings {
            reload_interval_s: 0.0,
            ..Default::default()
        };
        assert!(zero
            .validate()
            .unwrap_err()
            .to_string()
            .contains("reload_interval_s"));
        TlsSettings::default().validate().unwrap();
        assert!(TlsSettings::default().start().unwrap().is_none());
    }
}
