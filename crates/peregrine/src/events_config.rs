//! `[events]` of the serve settings: where object events and their snapshots are kept,
//! and for how long. Opening the store and starting its sink happen here too.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use peregrine_eventstore::{EventStore, StoreConfig};
use serde::Deserialize;

/// Event storage, as the config file's `[events]` section spells it.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct EventsSettings {
    /// The SQLite database of object events; `none` keeps no events.
    pub db: String,
    /// Where event snapshots (JPEG) are written, one folder per stream.
    pub snapshots_dir: PathBuf,
    /// Events older than this many days are deleted with their snapshots (0: kept).
    pub max_age_days: f64,
    /// At most this many events are kept, the oldest go first (0: no limit).
    pub max_events: u64,
    /// Snapshot files add up to at most this many MiB; past it the oldest are deleted
    /// (their events stay) (0: no limit).
    pub max_snapshot_mib: u64,
}

impl Default for EventsSettings {
    fn default() -> Self {
        let store = StoreConfig::default();
        Self {
            db: "data/events.sqlite3".into(),
            snapshots_dir: PathBuf::from("data/snapshots"),
            max_age_days: store.max_age.map_or(0.0, |d| d.as_secs_f64() / 86_400.0),
            max_events: store.max_events.unwrap_or(0),
            max_snapshot_mib: store.max_snapshot_bytes.map_or(0, |b| b >> 20),
        }
    }
}

/// Flags for [`EventsSettings`]; each overrides the config file.
#[derive(Debug, Args, Default)]
pub struct EventsArgs {
    /// SQLite database of object events (tracks, zones, lines), or `none` to keep no
    /// events [default: data/events.sqlite3].
    #[arg(long = "events-db", env = "PEREGRINE_EVENTS_DB")]
    pub db: Option<String>,
    /// Folder of event snapshots [default: data/snapshots].
    #[arg(long = "snapshots-dir", env = "PEREGRINE_SNAPSHOTS_DIR")]
    pub snapshots_dir: Option<PathBuf>,
    /// Delete events older than this many days, 0 to keep them [default: 7].
    #[arg(long = "events-max-age-days", env = "PEREGRINE_EVENTS_MAX_AGE_DAYS")]
    pub max_age_days: Option<f64>,
    /// Keep at most this many events, 0 for no limit [default: 100000].
    #[arg(long = "events-max-count", env = "PEREGRINE_EVENTS_MAX_COUNT")]
    pub max_events: Option<u64>,
    /// Keep at most this many MiB of snapshots, 0 for no limit [default: 1024].
    #[arg(long = "snapshots-max-mib", env = "PEREGRINE_SNAPSHOTS_MAX_MIB")]
    pub max_snapshot_mib: Option<u64>,
}

impl EventsArgs {
    pub fn apply(self, s: &mut EventsSettings) {
        if let Some(v) = self.db {
            s.db = v;
        }
        if let Some(v) = self.snapshots_dir {
            s.snapshots_dir = v;
        }
        if let Some(v) = self.max_age_days {
            s.max_age_days = v;
        }
        if let Some(v) = self.max_events {
            s.max_events = v;
        }
        if let Some(v) = self.max_snapshot_mib {
            s.max_snapshot_mib = v;
        }
    }
}

impl EventsSettings {
    pub fn validate(&self) -> Result<()> {
        anyhow::ensure!(
            self.max_age_days.is_finite() && self.max_age_days >= 0.0,
            "events.max_age_days must be 0 (keep) or a positive number of days, not {}",
            self.max_age_days
        );
        anyhow::ensure!(
            !self.db.is_empty(),
            "events.db is empty: give a file, or none to keep no events"
        );
        Ok(())
    }

    /// The store's settings, or `None` when events are not kept.
    pub fn store_config(&self) -> Option<StoreConfig> {
        if self.db == "none" {
            return None;
        }
        let limit = |v: u64| (v > 0).then_some(v);
        Some(StoreConfig {
            path: PathBuf::from(&self.db),
            max_age: (self.max_age_days > 0.0).then(|| Duration::from_secs_f64(self.max_age_days * 86_400.0)),
            max_events: limit(self.max_events),
            max_snapshot_bytes: limit(self.max_snapshot_mib).map(|m| m << 20),
            ..StoreConfig::default()
        })
    }

    /// Opens the event database (on a blocking thread: it may migrate or check a large
    /// file), or `None` when events are not kept.
    pub async fn open(&self) -> Result<Option<EventStore>> {
        let Some(config) = self.store_config() else {
            return Ok(None);
        };
        let path = config.path.clone();
        let store = tokio::task::spawn_blocking(move || EventStore::open(config))
            .await
            .context("opening the event store")?
            .with_context(|| format!("opening the event database {}", path.display()))?;
        tracing::info!(path = %path.display(), "event store open");
        Ok(Some(store))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn none_turns_storage_off_and_zero_lifts_a_limit() {
        let mut s = EventsSettings::default();
        assert_eq!(s.store_config().unwrap().max_events, Some(100_000));
        EventsArgs {
            max_events: Some(0),
            max_age_days: Some(0.0),
            ..Default::default()
        }
        .apply(&mut s);
        let c = s.store_config().unwrap();
        assert_eq!((c.max_events, c.max_age), (None, None));
        s.db = "none".into();
        assert!(s.store_config().is_none());
    }

    #[test]
    fn a_negative_age_is_refused_with_its_name() {
        let s = EventsSettings {
            max_age_days: -1.0,
            ..Default::default()
        };
        assert!(s
            .validate()
            .unwrap_err()
            .to_string()
            .contains("events.max_age_days"));
    }
}
