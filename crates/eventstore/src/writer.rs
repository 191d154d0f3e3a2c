//! The writer thread: the one owner of the read-write connection. It takes commands from
//! the bounded queue in order, gathers records and snapshot attachments into one
//! transaction per batch, answers the commands that wait (flush, delete, retention) after
//! committing everything before them, and applies retention on schedule.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use rusqlite::{params, Connection, OptionalExtension, Transaction};

use crate::batch::{PendingBatch, Periodic, Write};
use crate::config::StoreConfig;
use crate::error::StoreError;
use crate::event::{track_id_to_sql, NewEvent};
use crate::retention::{self, RetentionLimits, RetentionReport};
use crate::stats::Counters;

type Reply<T> = Sender<Result<T, StoreError>>;

/// What the handle asks of the writer.
pub(crate) enum Command {
    Write(Write),
    Flush(Reply<()>),
    Delete {
        id: String,
        reply: Reply<bool>,
    },
    RunRetention(Reply<RetentionReport>),
    /// The last handle is gone: commit what is pending and stop.
    Shutdown,
    /// Tests: run this on the writer's connection, in the writer's turn (to hold the writer
    /// as long as a test needs, or to make its disk "full").
    #[cfg(test)]
    OnWriter(Box<dyn FnOnce(&Connection) + Send>),
}

pub(crate) struct Writer {
    conn: Connection,
    commands: Receiver<Command>,
    batch: PendingBatch,
    retention: Periodic,
    limits: RetentionLimits,
    counters: Arc<Counters>,
    /// Events lost to failed commits since a flush last reported them.
    unreported_loss: Option<(u64, String)>,
}

/// What a committed batch did besides inserting.
#[derive(Default)]
struct BatchOutcome {
    written: u64,
    rejected: u64,
    files_to_delete: Vec<PathBuf>,
}

impl Writer {
    pub(crate) fn new(
        conn: Connection,
        commands: Receiver<Command>,
        config: &StoreConfig,
        counters: Arc<Counters>,
    ) -> Self {
        Self {
            conn,
            commands,
            batch: PendingBatch::new(config.max_batch, config.flush_interval),
            retention: Periodic::new(Instant::now(), config.retention_interval),
            limits: RetentionLimits::of(config),
            counters,
            unreported_loss: None,
        }
    }

    /// Runs until shut down or until every handle is gone; commits what is pending last.
    pub(crate) fn run(mut self) {
        loop {
            let now = Instant::now();
            if self.batch.is_due(now) {
                self.commit();
            }
            if self.retention.is_due(now) {
                // Errors are logged and counted inside; the next period tries again.
                let _ = self.run_retention(now);
            }
            let wake_at = match self.batch.due_at() {
                Some(due) => due.min(self.retention.next_at()),
                None => self.retention.next_at(),
            };
            match self.commands.recv_deadline(wake_at) {
                Ok(Command::Shutdown) | Err(RecvTimeoutError::Disconnected) => break,
                Ok(command) => self.handle(command),
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
        self.commit();
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Write(write) => self.batch.push(write, Instant::now()),
            Command::Flush(reply) => {
                self.commit();
                let result = match self.unreported_loss.take() {
                    Some((events, message)) => Err(StoreError::EventsLost { events, message }),
                    None => Ok(()),
                };
                let _ = reply.send(result);
            }
            Command::Delete { id, reply } => {
                self.commit();
                let _ = reply.send(self.delete(&id));
            }
            Command::RunRetention(reply) => {
                let _ = reply.send(self.run_retention(Instant::now()));
            }
            Command::Shutdown => {}
            #[cfg(test)]
            Command::OnWriter(run) => run(&self.conn),
        }
    }

    /// Commits the pending batch in one transaction. A failed batch is lost as a whole:
    /// counted, logged, and reported by the next flush.
    fn commit(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let writes = self.batch.take();
        match self.write_batch(&writes) {
            Ok(outcome) => {
                Counters::add(&self.counters.written, outcome.written);
                Counters::add(&self.counters.rejected, outcome.rejected);
                self.delete_files(&outcome.files_to_delete);
            }
            Err(error) => {
                let events = writes.iter().filter(|w| matches!(w, Write::Insert(_))).count() as u64;
                let message = error.to_string();
                tracing::error!(events, error = %message, "event batch could not be committed; its events are lost");
                Counters::add(&self.counters.failed, events);
                self.counters.set_last_error(format!("commit failed: {message}"));
                let lost_before = self.unreported_loss.take().map_or(0, |(lost, _)| lost);
                self.unreported_loss = Some((lost_before + events, message));
            }
        }
    }

    fn write_batch(&mut self, writes: &[Write]) -> rusqlite::Result<BatchOutcome> {
        let counters = &*self.counters;
        let tx = self.conn.transaction()?;
        let mut outcome = BatchOutcome::default();
        for write in writes {
            match write {
                Write::Insert(event) => insert(&tx, counters, event, &mut outcome)?,
                Write::AttachSnapshot { id, path } => attach(&tx, counters, id, path, &mut outcome)?,
            }
        }
        tx.commit()?;
        Ok(outcome)
    }

    fn delete(&mut self, id: &str) -> Result<bool, StoreError> {
        let deleted: Option<Option<String>> = self
            .conn
            .query_row(
                "DELETE FROM events WHERE id = ?1 RETURNING snapshot",
                [id],
                |row| row.get(0),
            )
            .optional()
            .map_err(|error| StoreError::Write(error.to_string()))?;
        if let Some(Some(snapshot)) = &deleted {
            self.delete_files(&[PathBuf::from(snapshot)]);
        }
        Ok(deleted.is_some())
    }

    fn run_retention(&mut self, now: Instant) -> Result<RetentionReport, StoreError> {
        self.commit();
        self.retention.ran(now);
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| i64::try_from(since.as_millis()).unwrap_or(i64::MAX));
        let applied = self.conn.transaction().and_then(|tx| {
            let outcome = retention::apply(&tx, &self.limits, now_ms)?;
            tx.commit()?;
            Ok(outcome)
        });
        match applied {
            Ok((report, files)) => {
                Counters::add(&self.counters.removed_by_retention, report.events_removed);
                self.delete_files(&files);
                if report != RetentionReport::default() {
                    tracing::info!(
                        events = report.events_removed,
                        snapshots = report.snapshots_removed,
                        "retention removed old events"
                    );
                }
                Ok(report)
            }
            Err(error) => {
                tracing::error!(%error, "event retention failed");
                self.counters.set_last_error(format!("retention failed: {error}"));
                Err(StoreError::Write(error.to_string()))
            }
        }
    }

    /// Deletes snapshot files the database no longer references. A file already gone is
    /// fine; any other failure is logged and kept as the last error.
    fn delete_files(&self, files: &[PathBuf]) {
        for file in files {
            match std::fs::remove_file(file) {
                Ok(()) => Counters::add(&self.counters.snapshots_deleted, 1),
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => {
                    tracing::warn!(path = %file.display(), %error, "could not delete a snapshot file");
                    self.counters
                        .set_last_error(format!("deleting snapshot {} failed: {error}", file.display()));
                }
            }
        }
    }
}

/// Inserts one event; a second event with a stored id is refused (and its snapshot file
/// left alone: it may be the stored event's own).
fn insert(
    tx: &Transaction<'_>,
    counters: &Counters,
    event: &NewEvent,
    outcome: &mut BatchOutcome,
) -> rusqlite::Result<()> {
    let mut insert = tx.prepare_cached(
        "INSERT INTO events
           (id, stream, kind, label, track_id, zone, at_ms, score, payload, snapshot, snapshot_bytes)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
         ON CONFLICT (id) DO NOTHING",
    )?;
    let snapshot = event.snapshot.as_deref().and_then(|path| sized(counters, path));
    let inserted = insert.execute(params![
        event.id,
        event.stream,
        event.kind,
        event.label,
        event.track_id.map(track_id_to_sql),
        event.zone,
        event.at_ms,
        event.score.map(f64::from),
        event.payload,
        snapshot.as_ref().map(|(path, _)| path),
        snapshot.as_ref().map(|(_, bytes)| *bytes),
    ])?;
    if inserted == 1 {
        outcome.written += 1;
    } else {
        tracing::warn!(
            id = event.id,
            stream = event.stream,
            "an event with this id is already stored; the new one is dropped"
        );
        counters.set_last_error(format!("duplicate event id {:?}", event.id));
        outcome.rejected += 1;
    }
    Ok(())
}

/// Points an event at its snapshot file, deleting the one it replaces. A snapshot for an
/// event the store does not have (never recorded, deleted, or retired) is deleted: the
/// store took it over with the call.
fn attach(
    tx: &Transaction<'_>,
    counters: &Counters,
    id: &str,
    path: &Path,
    outcome: &mut BatchOutcome,
) -> rusqlite::Result<()> {
    let stored: Option<Option<String>> = tx
        .prepare_cached("SELECT snapshot FROM events WHERE id = ?1")?
        .query_row([id], |row| row.get(0))
        .optional()?;
    let Some(previous) = stored else {
        tracing::warn!(id, path = %path.display(), "snapshot for an event the store does not have; deleting it");
        outcome.rejected += 1;
        outcome.files_to_delete.push(path.to_owned());
        return Ok(());
    };
    let Some((text, bytes)) = sized(counters, path) else {
        outcome.rejected += 1;
        return Ok(());
    };
    tx.prepare_cached("UPDATE events SET snapshot = ?2, snapshot_bytes = ?3 WHERE id = ?1")?
        .execute(params![id, text, bytes])?;
    if let Some(previous) = previous.filter(|previous| previous != &text) {
        outcome.files_to_delete.push(PathBuf::from(previous));
    }
    Ok(())
}

/// The snapshot's path as stored, and its size for the byte limit; `None` (the event is
/// stored without it) if the file cannot be read.
fn sized(counters: &Counters, path: &Path) -> Option<(String, i64)> {
    let text = path.to_str()?.to_owned();
    match std::fs::metadata(path) {
        Ok(metadata) => Some((text, i64::try_from(metadata.len()).unwrap_or(i64::MAX))),
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "snapshot file unreadable; event kept without it");
            counters.set_last_error(format!("snapshot {} unreadable: {error}", path.display()));
            None
        }
    }
}
