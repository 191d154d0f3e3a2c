//! What an event store is told when it opens, with its defaults in one place.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::StoreError;

/// The longest `flush_interval` accepted: a crash may lose what was recorded in the last
/// interval, and the promise is "at most the last second".
pub const MAX_FLUSH_INTERVAL: Duration = Duration::from_secs(1);

/// Settings of one event store.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreConfig {
    /// The SQLite database file. Its parent directories are created; SQLite keeps its `-wal`
    /// and `-shm` files beside it. Default `events/events.sqlite3`.
    pub path: PathBuf,
    /// Events captured (`at_ms`) longer ago than this are removed with their snapshots.
    /// `None` keeps events regardless of age. Default 7 days.
    pub max_age: Option<Duration>,
    /// At most this many events are kept; the oldest go first, with their snapshots.
    /// `None`: no limit. Default 100 000.
    pub max_events: Option<u64>,
    /// The snapshot files the store references add up to at most this many bytes; past it
    /// the oldest snapshots are deleted (their events stay, without a snapshot).
    /// `None`: no limit. Default 1 GiB.
    pub max_snapshot_bytes: Option<u64>,
    /// A recorded event is committed at most this long after `record` took it (so a crash
    /// loses at most this much): one transaction per interval, or sooner when `max_batch`
    /// events are waiting. More than 0 and at most 1 s. Default 200 ms.
    pub flush_interval: Duration,
    /// Writes waiting for the writer thread at most. When it is full, `record` and
    /// `attach_snapshot` drop the write and count it (they never wait); `flush`, `delete` and
    /// `run_retention` wait for room. Default 10 000.
    pub queue_capacity: usize,
    /// Events committed in one transaction at most. Default 1 000.
    pub max_batch: usize,
    /// How often the writer applies the retention limits (and once at open). Default 60 s.
    pub retention_interval: Duration,
    /// Read connections for `query` and `get`: this many can run at once, beside the writer;
    /// further readers wait for one to be free. Default 4.
    pub read_connections: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            path: PathBuf::from("events/events.sqlite3"),
            max_age: Some(Duration::from_secs(7 * 24 * 3600)),
            max_events: Some(100_000),
            max_snapshot_bytes: Some(1 << 30),
            flush_interval: Duration::from_millis(200),
            queue_capacity: 10_000,
            max_batch: 1_000,
            retention_interval: Duration::from_secs(60),
            read_connections: 4,
        }
    }
}

impl StoreConfig {
    /// The default settings for a database at `path`.
    pub fn at(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            ..Self::default()
        }
    }

    pub(crate) fn validate(&self) -> Result<(), StoreError> {
        let invalid = |message: String| Err(StoreError::InvalidConfig(message));
        if self.flush_interval.is_zero() || self.flush_interval > MAX_FLUSH_INTERVAL {
            return invalid(format!(
                "flush interval {:?} is out of range: it must be more than 0 and at most {:?} \
                 (a crash loses up to one interval of events)",
                self.flush_interval, MAX_FLUSH_INTERVAL
            ));
        }
        if self.queue_capacity == 0 {
            return invalid("queue capacity is 0: it must hold at least one write".into());
        }
        if self.max_batch == 0 {
            return invalid("max batch is 0: a transaction must take at least one event".into());
        }
        if self.retention_interval.is_zero() {
            return invalid("retention interval is 0: it must be a positive duration".into());
        }
        if self.read_connections == 0 {
            return invalid("read connections is 0: queries need at least one".into());
        }
        if self.path.as_os_str().is_empty() {
            return invalid("the database path is empty".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid_and_each_bad_setting_is_named() {
        assert!(StoreConfig::default().validate().is_ok());
        type Spoil = fn(&mut StoreConfig);
        let cases: [(&str, Spoil); 6] = [
            ("flush interval", |c| c.flush_interval = Duration::ZERO),
            ("flush interval", |c| {
                c.flush_interval = Duration::from_millis(1001)
            }),
            ("queue capacity", |c| c.queue_capacity = 0),
            ("max batch", |c| c.max_batch = 0),
            ("retention interval", |c| c.retention_interval = Duration::ZERO),
            ("read connections", |c| c.read_connections = 0),
        ];
        for (named, spoil) in cases {
            let mut config = StoreConfig::default();
            spoil(&mut config);
            let message = config.validate().unwrap_err().to_string();
            assert!(message.contains(named), "{message:?} should name {named:?}");
        }
        let config = StoreConfig {
            flush_interval: MAX_FLUSH_INTERVAL,
            ..StoreConfig::default()
        };
        assert!(config.validate().is_ok(), "1 s itself is allowed");
    }
}
