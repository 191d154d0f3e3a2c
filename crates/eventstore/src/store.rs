//! [`EventStore`], the handle: it sends writes to the writer thread through the bounded
//! queue and runs reads on the read pool. Every method is synchronous: `record` and
//! `attach_snapshot` never wait (call them from anywhere, a tokio task included), the others
//! block (call them from `spawn_blocking` or a thread of your own).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Sender, TrySendError};

use crate::batch::Write;
use crate::config::StoreConfig;
use crate::error::{Dropped, StoreError};
use crate::event::{id_invalid_because, snapshot_path_invalid_because, NewEvent, StoredEvent};
use crate::query::{self, EventQuery, Page};
use crate::readers::ReadPool;
use crate::retention::RetentionReport;
use crate::schema;
use crate::stats::{Counters, StoreStats};
use crate::writer::{Command, Writer};

/// A handle on one event database. Clones are cheap and share the writer and the read
/// pool; the writer commits what is queued and stops when the last clone is dropped.
#[derive(Clone)]
pub struct EventStore {
    shared: Arc<Shared>,
}

struct Shared {
    path: PathBuf,
    commands: Sender<Command>,
    queue_capacity: usize,
    readers: ReadPool,
    counters: Arc<Counters>,
    writer: Option<JoinHandle<()>>,
}

impl EventStore {
    /// Opens (or creates) the database: its directory, the schema (migrated to the current
    /// version), WAL mode, the read connections, and the writer thread. Retention runs once
    /// at start, then every `retention_interval`.
    pub fn open(config: StoreConfig) -> Result<Self, StoreError> {
        config.validate()?;
        if let Some(dir) = config.path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir {
                path: dir.to_owned(),
                source,
            })?;
        }
        let conn = schema::open_writer(&config.path)?;
        let readers = ReadPool::open(&config.path, config.read_connections)?;
        let counters = Arc::new(Counters::default());
        // Full queue: `record` and `attach_snapshot` drop and count (the video pipeline
        // must not stall on a slow disk); flush, delete and retention wait for room.
        let (commands, queue) = crossbeam_channel::bounded(config.queue_capacity);
        let writer = Writer::new(conn, queue, &config, Arc::clone(&counters));
        let writer = std::thread::Builder::new()
            .name("eventstore-writer".into())
            .spawn(move || writer.run())
            .map_err(StoreError::StartWriter)?;
        tracing::info!(path = %config.path.display(), "event store open");
        Ok(Self {
            shared: Arc::new(Shared {
                path: config.path,
                commands,
                queue_capacity: config.queue_capacity,
                readers,
                counters,
                writer: Some(writer),
            }),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Queues an event for the next batch. Never waits: a full queue drops the event and
    /// counts it; an invalid event is refused and counted. `get` and `query` see it once its
    /// batch is committed (within `flush_interval`, or at `flush`).
    pub fn record(&self, event: NewEvent) -> Result<(), Dropped> {
        if let Some(reason) = event.invalid_because() {
            return Err(self.reject(event.id, reason));
        }
        self.submit(Command::Write(Write::Insert(event)))
    }

    /// Gives a recorded event its snapshot file (written after the event: the best frame is
    /// known later). The store owns the file once this returns `Ok`: it replaces (and
    /// deletes) an earlier snapshot, and deletes this one if the event is gone. On `Err` the
    /// file is still the caller's. Never waits, like `record`.
    pub fn attach_snapshot(&self, id: &str, path: PathBuf) -> Result<(), Dropped> {
        if let Some(reason) = id_invalid_because(id).or_else(|| snapshot_path_invalid_because(&path)) {
            return Err(self.reject(id.to_owned(), reason));
        }
        let id = id.to_owned();
        self.submit(Command::Write(Write::AttachSnapshot { id, path }))
    }

    /// One page of events, newest first. Blocks on a read connection; sees what has been
    /// committed.
    pub fn query(&self, query: &EventQuery) -> Result<Page, StoreError> {
        query.validate()?;
        self.shared.readers.with(|conn| query::run(conn, query))
    }

    /// The event with this id, if it is stored (committed).
    pub fn get(&self, id: &str) -> Result<Option<StoredEvent>, StoreError> {
        self.shared.readers.with(|conn| query::get(conn, id))
    }

    /// Deletes an event and its snapshot file; `false` if there was no such event. Writes
    /// queued before it are committed first, so an event just recorded can be deleted.
    pub fn delete(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_owned();
        self.request(|reply| Command::Delete { id, reply })
    }

    /// Waits until everything queued before it is committed. Reports events lost to a failed
    /// commit since the last flush.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.request(Command::Flush)
    }

    /// Applies the retention limits now (after committing what is queued) instead of
    /// waiting for the next period.
    pub fn run_retention(&self) -> Result<RetentionReport, StoreError> {
        self.request(Command::RunRetention)
    }

    /// Counters for metrics.
    pub fn stats(&self) -> StoreStats {
        self.shared.counters.read(self.shared.commands.len())
    }

    /// Flushes and lets go of this handle; the last handle's drop stops the writer thread.
    pub fn close(self) -> Result<(), StoreError> {
        self.flush()
    }

    fn submit(&self, command: Command) -> Result<(), Dropped> {
        match self.shared.commands.try_send(command) {
            Ok(()) => Ok(()),
            Err(full_or_stopped) => {
                Counters::add(&self.shared.counters.dropped, 1);
                Err(match full_or_stopped {
                    TrySendError::Full(_) => Dropped::QueueFull {
                        capacity: self.shared.queue_capacity,
                    },
                    TrySendError::Disconnected(_) => Dropped::WriterStopped,
                })
            }
        }
    }

    fn reject(&self, id: String, reason: &'static str) -> Dropped {
        Counters::add(&self.shared.counters.rejected, 1);
        Dropped::Invalid { id, reason }
    }

    /// Sends a command that carries its own reply channel and waits for the answer.
    fn request<T>(
        &self,
        command: impl FnOnce(Sender<Result<T, StoreError>>) -> Command,
    ) -> Result<T, StoreError> {
        let (reply, answer) = crossbeam_channel::bounded(1);
        self.shared
            .commands
            .send(command(reply))
            .map_err(|_| StoreError::WriterStopped)?;
        answer.recv().map_err(|_| StoreError::WriterStopped)?
    }

    /// Tests: run `on_writer` on the writer's connection in its turn, without waiting.
    #[cfg(test)]
    pub(crate) fn on_writer(&self, on_writer: impl FnOnce(&rusqlite::Connection) + Send + 'static) {
        self.shared
            .commands
            .send(Command::OnWriter(Box::new(on_writer)))
            .expect("the writer runs");
    }

    /// Tests: hold the writer (it takes no commands) until the guard is dropped.
    #[cfg(test)]
    pub(crate) fn hold_writer(&self) -> WriterHold {
        let (held, writer_held) = crossbeam_channel::bounded(1);
        let (release, released) = crossbeam_channel::bounded::<()>(0);
        self.on_writer(move |_| {
            let _ = held.send(());
            let _ = released.recv();
        });
        writer_held
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the writer takes the hold");
        WriterHold { _release: release }
    }
}

/// While alive, the writer waits; dropping it lets the writer go on.
#[cfg(test)]
pub(crate) struct WriterHold {
    _release: Sender<()>,
}

impl std::fmt::Debug for EventStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStore")
            .field("path", &self.shared.path)
            .finish_non_exhaustive()
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Waits for room if the queue is full: the queued writes are committed before the
        // writer stops. Fails only if the writer already stopped.
        let _ = self.commands.send(Command::Shutdown);
        if let Some(writer) = self.writer.take() {
            if writer.join().is_err() {
                tracing::error!(path = %self.path.display(), "the event store's writer thread panicked");
            }
        }
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
