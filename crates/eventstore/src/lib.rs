//! The event database: tracked-object, zone and line events with their snapshot files,
//! kept in SQLite (WAL mode) so they survive restarts and crashes, and paged back newest
//! first.
//!
//! It knows nothing of video or wire formats: an event is a few indexed fields and the
//! caller's JSON `payload`, stored as it is. [`EventStore`] (in [`store`]) is the cheap,
//! cloneable handle; the `writer` thread is the one owner of the read-write connection and
//! commits what the bounded queue brings in one transaction per batch, with `batch`
//! deciding when (plain state, no clock) and `retention` what goes when the store is over
//! its limits. Reads run beside it on a small pool of read-only connections (`readers`).
//! [`query`] holds the filters and the cursor paging, `schema` the `user_version`
//! migrations, [`config`] the settings and their defaults, [`error`] the errors, [`stats`]
//! the counters for metrics. No async runtime: `record` never waits and the rest block, so
//! async callers use `spawn_blocking`.

mod batch;
pub mod config;
pub mod error;
mod event;
pub mod query;
mod readers;
mod retention;
mod schema;
pub mod stats;
pub mod store;
mod writer;

pub use config::{StoreConfig, MAX_FLUSH_INTERVAL};
pub use error::{Dropped, StoreError};
pub use event::{Event, NewEvent, StoredEvent, MAX_ID_BYTES};
pub use query::{Cursor, CursorError, EventQuery, Page, DEFAULT_LIMIT, MAX_LIMIT};
pub use retention::RetentionReport;
pub use schema::SCHEMA_VERSION;
pub use stats::StoreStats;
pub use store::EventStore;
