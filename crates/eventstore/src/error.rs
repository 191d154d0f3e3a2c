//! The event store's errors: [`StoreError`] for calls that wait for an answer, [`Dropped`]
//! for the writes that `record` and `attach_snapshot` refuse without waiting.

use std::path::PathBuf;

use crate::query::CursorError;

/// What went wrong in a store call. Caller mistakes (`LimitOutOfRange`, `EmptyTimeRange`,
/// `BadCursor`) are the request's fault (HTTP 400); the rest are the server's.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("invalid event store setting: {0}")]
    InvalidConfig(String),
    #[error("could not create the event database's directory {path}: {source}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("could not open the event database {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "the event database {path} could not use write-ahead logging (journal mode is \
         {mode:?}); put it on a local file system"
    )]
    NoWal { path: PathBuf, mode: String },
    #[error(
        "the event database {path} has schema version {found}, newer than this build \
         understands (up to {supported}); run a newer Peregrine or point it at another file"
    )]
    SchemaTooNew {
        path: PathBuf,
        found: i64,
        supported: i64,
    },
    #[error("could not bring the event database {path} to schema version {version}: {source}")]
    Migrate {
        path: PathBuf,
        version: usize,
        #[source]
        source: rusqlite::Error,
    },
    #[error("limit {0} is out of range: ask for 1 to {max} events per page", max = crate::query::MAX_LIMIT)]
    LimitOutOfRange(usize),
    #[error("the time range is empty: after ({after_ms} ms) must be earlier than before ({before_ms} ms)")]
    EmptyTimeRange { after_ms: i64, before_ms: i64 },
    #[error(transparent)]
    BadCursor(#[from] CursorError),
    #[error("reading the event database failed: {0}")]
    Read(#[source] rusqlite::Error),
    #[error("writing to the event database failed: {0}")]
    Write(String),
    #[error("{events} events could not be committed to the event database: {message}")]
    EventsLost { events: u64, message: String },
    #[error("could not start the event store's writer thread: {0}")]
    StartWriter(#[source] std::io::Error),
    #[error("the event store's writer thread has stopped; nothing more can be written")]
    WriterStopped,
}

impl StoreError {
    /// Whether the caller's request was at fault (a bad limit, time range or cursor), rather
    /// than the store.
    pub fn is_bad_request(&self) -> bool {
        matches!(
            self,
            Self::LimitOutOfRange(_) | Self::EmptyTimeRange { .. } | Self::BadCursor(_)
        )
    }
}

/// A write that `record` or `attach_snapshot` refused at once. Every one is counted in
/// [`StoreStats`](crate::StoreStats) (`dropped` or `rejected`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Dropped {
    #[error("the event store's queue is full ({capacity} writes waiting): the write was dropped")]
    QueueFull { capacity: usize },
    #[error("the event store's writer thread has stopped: the write was dropped")]
    WriterStopped,
    #[error("event {id:?} was refused: {reason}")]
    Invalid { id: String, reason: &'static str },
}
