//! The event store as a sink: object events go into SQLite (`peregrine-eventstore`) with
//! their wire JSON, and their snapshots into files beside it. Detection events and status
//! changes are not stored, and neither are `object.update`s: each is a progress report
//! that the next one supersedes, and the object's `object.end` carries its final state
//! (`after`: zones entered, top score, stationary) and its best snapshot. Storing them
//! would add a row every few seconds per object that retention by count then weighs
//! against real events; rewriting the `object.start` row instead would change a stored
//! event after the fact, where the store keeps each event as it was published.
//!
//! The store's own queue never waits (a full queue drops the write and counts it); this
//! sink's [`SinkQueue`] in front of it drops the oldest message when full, as every sink's
//! does. Snapshot files are written on the blocking pool, never on a tokio worker.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use peregrine_eventstore::{Dropped, EventStore, NewEvent};
use tokio::task::JoinHandle;

use crate::event::{ObjectEvent, SinkMessage};
use crate::fanout::SinkQueue;
use crate::sinks::wire;
use crate::telemetry;

/// Messages waiting for the store sink: a burst of object events from many streams.
const QUEUE: usize = 4096;

/// A running store sink.
#[derive(Debug)]
pub struct StoreSink {
    queue: SinkQueue,
    task: JoinHandle<()>,
}

impl StoreSink {
    /// Starts feeding `store`; snapshots go under `snapshots/<stream>/<event id>.jpg`.
    pub fn start(store: EventStore, snapshots: PathBuf) -> Self {
        let queue = SinkQueue::new("store", QUEUE);
        let task = tokio::spawn(run(queue.clone(), store, snapshots));
        Self { queue, task }
    }

    pub fn queue(&self) -> SinkQueue {
        self.queue.clone()
    }

    /// Stores what is queued, then stops.
    pub async fn shut_down(self) {
        self.queue.close();
        let _ = self.task.await;
    }
}

async fn run(queue: SinkQueue, store: EventStore, snapshots: PathBuf) {
    while let Some(message) = queue.pop().await {
        let SinkMessage::Object(event) = message else {
            continue;
        };
        if !event.kind.stored() {
            continue;
        }
        let snapshot = match &event.snapshot {
            Some(jpeg) => write_snapshot(&snapshots, &event, jpeg.clone()).await,
            None => None,
        };
        let payload = String::from_utf8(wire::object_json(&event, snapshot.is_some())).unwrap_or_default();
        let row = NewEvent {
            id: event.id.to_string(),
            stream: event.stream.to_string(),
            kind: event.kind.name().to_string(),
            label: Some(event.label.clone()),
            track_id: Some(event.track_id),
            zone: event.kind.place().map(str::to_string),
            at_ms: wire::unix_ms(event.capture.wall),
            score: Some(event.score),
            payload,
            snapshot,
        };
        let file = row.snapshot.clone();
        match store.record(row) {
            Ok(()) => telemetry::sink_delivered("store"),
            Err(dropped) => {
                telemetry::store_dropped(match dropped {
                    Dropped::QueueFull { .. } => "queue_full",
                    Dropped::WriterStopped => "writer_stopped",
                    Dropped::Invalid { .. } => "invalid",
                });
                tracing::warn!(id = %event.id, error = %dropped, "event not stored");
                // The store owns a snapshot only once it took the event.
                if let Some(f) = file {
                    let _ = tokio::task::spawn_blocking(move || std::fs::remove_file(f)).await;
                }
            }
        }
    }
    match tokio::task::spawn_blocking(move || store.flush()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "the event store reported lost events at shutdown"),
        Err(e) => tracing::warn!(error = %e, "the event store did not flush at shutdown"),
    }
}

/// Writes a snapshot file; `None` (logged and counted) when the disk refuses it, so the
/// event is still stored, without a picture.
async fn write_snapshot(dir: &Path, event: &ObjectEvent, jpeg: Arc<Vec<u8>>) -> Option<PathBuf> {
    let path = dir.join(&*event.stream).join(format!("{}.jpg", event.id));
    let target = path.clone();
    let written = tokio::task::spawn_blocking(move || {
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&target, &*jpeg)
    })
    .await;
    match written {
        Ok(Ok(())) => Some(path),
        Ok(Err(e)) => {
            tracing::warn!(path = %path.display(), error = %e, "snapshot not written");
            telemetry::store_dropped("snapshot_write_failed");
            None
        }
        Err(_) => None,
    }
}
