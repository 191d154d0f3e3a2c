//! `[auth]` of the serve settings: the API keys file, whether a server reachable from
//! other machines may run without keys, and whether health and metrics need a key.
//! Loading (and reloading) the keys and the start-up check of the listen address happen
//! here too; `peregrine keys new` makes keys.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use peregrine_api::access::Access;
use peregrine_auth::{AccessControl, KeyStore, Scope};
use serde::Deserialize;

/// Access control, as the config file's `[auth]` section spells it.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct AuthSettings {
    /// TOML file of API keys (`[[keys]]` with id, sha256, scopes, limits); none: no keys.
    pub api_keys_file: Option<PathBuf>,
    /// Serve without keys on a non-loopback address (anyone who reaches the port may do
    /// anything).
    pub allow_anonymous: bool,
    /// Health probes need a key (any key) too.
    pub protect_health: bool,
    /// `/metrics` needs a key (any key) too.
    pub protect_metrics: bool,
}

/// Flags for [`AuthSettings`]; each overrides the config file.
#[derive(Debug, Args, Default)]
pub struct AuthArgs {
    /// TOML file of API keys, made with `peregrine keys new`; every request but health and
    /// metrics then needs a key with the right scope [default: none, no keys].
    #[arg(long, env = "PEREGRINE_API_KEYS_FILE")]
    pub api_keys_file: Option<PathBuf>,
    /// Serve without API keys on a non-loopback address (by default the server refuses
    /// to start there without keys) [default: false].
    #[arg(long, env = "PEREGRINE_ALLOW_ANONYMOUS", num_args = 0..=1, default_missing_value = "true")]
    pub allow_anonymous: Option<bool>,
    /// Health routes (/health/*, /v2/health/*, gRPC health) need a key too [default: false].
    #[arg(long, env = "PEREGRINE_PROTECT_HEALTH", num_args = 0..=1, default_missing_value = "true")]
    pub protect_health: Option<bool>,
    /// /metrics needs a key too [default: false].
    #[arg(long, env = "PEREGRINE_PROTECT_METRICS", num_args = 0..=1, default_missing_value = "true")]
    pub protect_metrics: Option<bool>,
}

impl AuthArgs {
    pub fn apply(self, s: &mut AuthSettings) {
        if self.api_keys_file.is_some() {
            s.api_keys_file = self.api_keys_file;
        }
        if let Some(v) = self.allow_anonymous {
            s.allow_anonymous = v;
        }
        if let Some(v) = self.protect_health {
            s.protect_health = v;
        }
        if let Some(v) = self.protect_metrics {
            s.protect_metrics = v;
        }
    }
}

/// Whether only this machine can reach `host`: `localhost` or a loopback address.
/// Anything else (`0.0.0.0`, `::`, a LAN address, another host name) is reachable from
/// elsewhere.
pub fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost") || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn read_keys(path: &Path) -> Result<KeyStore> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the API keys file {}", path.display()))?;
    KeyStore::parse(&text).with_context(|| format!("API keys file {}", path.display()))
}

impl AuthSettings {
    /// The access control to serve with, after checking that `host` may be served that
    /// way: a non-loopback host needs keys unless anonymous access is asked for.
    pub fn access(&self, host: &str) -> Result<Access> {
        let control = match &self.api_keys_file {
            Some(path) => {
                let keys = read_keys(path)?;
                tracing::info!(path = %path.display(), keys = keys.entries().len(), "API keys required");
                AccessControl::with_keys(keys)
            }
            None if is_loopback(host) || self.allow_anonymous => {
                if !is_loopback(host) {
                    tracing::warn!(
                        host,
                        "serving without API keys on a non-loopback address (allow_anonymous)"
                    );
                }
                AccessControl::anonymous()
            }
            None => anyhow::bail!(
                "refusing to listen on {host} without API keys: anyone who can reach the port could run, \
                 load and unload models and add streams. Either give API keys (--api-keys-file or \
                 PEREGRINE_API_KEYS_FILE; make them with `peregrine keys new`), or listen on this machine \
                 only (--host 127.0.0.1), or serve without keys on purpose (--allow-anonymous)"
            ),
        };
        Ok(Access::new(control, self.protect_health, self.protect_metrics))
    }

    /// Reloads the keys file when its modification time changes (checked every 2 s) or on
    /// SIGHUP. This task is the keys' one owner; a file that no longer parses is logged and
    /// the keys in use stay.
    pub fn spawn_reload(&self, access: Access) {
        let Some(path) = self.api_keys_file.clone() else {
            return;
        };
        tokio::spawn(async move {
            let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
            let mut seen: Option<SystemTime> = modified(&path);
            let mut hangup = hangups();
            let mut poll = tokio::time::interval(Duration::from_secs(2));
            loop {
                let forced = tokio::select! {
                    _ = poll.tick() => false,
                    Some(()) = hangup.recv() => true,
                };
                let now = modified(&path);
                if !forced && now == seen {
                    continue;
                }
                seen = now;
                match read_keys(&path) {
                    Ok(keys) => {
                        tracing::info!(path = %path.display(), keys = keys.entries().len(), "API keys reloaded");
                        access.replace(AccessControl::with_keys(keys));
                    }
                    Err(e) => {
                        tracing::error!(path = %path.display(), "API keys not reloaded, the old ones stay: {}", crate::error_chain::one_line(&e))
                    }
                }
            }
        });
    }
}

/// SIGHUPs as a channel (never anything where signals are not available).
fn hangups() -> tokio::sync::mpsc::Receiver<()> {
    // One pending reload is enough: more SIGHUPs while one waits change nothing.
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    #[cfg(unix)]
    if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        tokio::spawn(async move {
            while s.recv().await.is_some() {
                let _ = tx.try_send(());
            }
        });
    }
    #[cfg(not(unix))]
    drop(tx);
    rx
}

/// `peregrine keys`: API key management.
#[derive(Debug, Args)]
pub struct KeysArgs {
    #[command(subcommand)]
    pub command: KeysCommand,
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Make a new random API key: prints the key (once: only its hash is kept) and the
    /// entry to add to the keys file.
    New {
        /// The key's name in metrics and logs (letters, digits, '-', '_', '.').
        #[arg(long)]
        id: String,
        /// What the key may do, comma separated: infer, streams, admin (each is separate:
        /// admin does not include infer).
        #[arg(long, value_delimiter = ',', required = true)]
        scopes: Vec<Scope>,
    },
}

pub fn run_keys(args: KeysArgs) -> Result<ExitCode> {
    match args.command {
        KeysCommand::New { id, scopes } => {
            let made = peregrine_auth::new_key(&id, &scopes)?;
            eprintln!("peregrine: the key below is shown once; only its SHA-256 goes into the keys file");
            println!("{}", made.key);
            println!();
            print!("{}", made.entry);
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_are_told_from_reachable_ones() {
        for host in ["127.0.0.1", "localhost", "LOCALHOST", "::1", "[::1]", "127.0.0.2"] {
            assert!(is_loopback(host), "{host}");
        }
        for host in [
            "0.0.0.0",
            "::",
            "[::]",
            "192.168.1.10",
            "10.0.0.1",
            "example.com",
            "localhost.evil.com",
        ] {
            assert!(!is_loopback(host), "{host}");
        }
    }

    #[test]
    fn a_reachable_host_without_keys_is_refused_with_the_three_ways_out() {
        let settings = AuthSettings::default();
        let err = settings.access("0.0.0.0").err().expect("refused").to_string();
        for way in ["--api-keys-file", "--host 127.0.0.1", "--allow-anonymous"] {
            assert!(err.contains(way), "{err}");
        }
        assert!(settings.access("127.0.0.1").is_ok());
        let anonymous = AuthSettings {
            allow_anonymous: true,
            ..Default::default()
        };
        assert!(anonymous.access("::").is_ok());
    }

    #[test]
    fn a_broken_keys_file_is_refused_with_its_path_and_problem() {
        let dir = std::env::temp_dir().join(format!("peregrine-auth-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("keys.toml");
        std::fs::write(
            &file,
            "[[keys]]\nid = \"a\"\nsha256 = \"00\"\nscopes = [\"infer\"]\n",
        )
        .unwrap();
        let settings = AuthSettings {
            api_keys_file: Some(file.clone()),
            ..Default::default()
        };
        let err = format!("{:#}", settings.access("0.0.0.0").err().unwrap());
        assert!(
            err.contains("keys.toml") && err.contains("sha256 has 1 bytes"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_readme_auth_example_is_a_valid_config() {
        let readme = include_str!("../../../README.md");
        let start = readme.find("[auth]\n").expect("README has an [auth] example");
        let end = start + readme[start..].find("```").unwrap();
        let parsed: crate::serve_config::ServeSettings = toml::from_str(&readme[start..end]).unwrap();
        assert_eq!(
            parsed.auth.api_keys_file.as_deref(),
            Some(Path::new("/etc/peregrine/keys.toml"))
        );
        assert!(parsed.auth.protect_metrics && !parsed.auth.allow_anonymous);
    }

    #[test]
    fn flags_override_the_file() {
        let mut s = AuthSettings {
            protect_health: true,
            ..Default::default()
        };
        AuthArgs {
            allow_anonymous: Some(true),
            protect_health: Some(false),
            ..Default::default()
        }
        .apply(&mut s);
        assert!(s.allow_anonymous && !s.protect_health);
    }
}
