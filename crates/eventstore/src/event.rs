//! The rows: [`Event`], what a caller records and a query returns, and its checks.

use std::path::{Path, PathBuf};

/// Longest event id accepted, in bytes. Ids are the caller's (UUIDv7 text is 36).
pub const MAX_ID_BYTES: usize = 200;

/// An event: what a caller records ([`NewEvent`]) is what a query returns
/// ([`StoredEvent`]). The store reads only the indexed fields; `payload` is the caller's
/// wire JSON, stored and returned as it is.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// The caller's id, time-ordered (UUIDv7 text, say): it is published (webhooks, MQTT)
    /// before the row exists, so the store does not make one. Unique: a second event with
    /// the same id is refused and counted.
    pub id: String,
    pub stream: String,
    /// What happened: "object.start", "zone.enter", "line.cross", ...
    pub kind: String,
    pub label: Option<String>,
    pub track_id: Option<u64>,
    pub zone: Option<String>,
    /// Capture time, unix milliseconds: events are ordered, paged and aged by it.
    pub at_ms: i64,
    pub score: Option<f32>,
    pub payload: String,
    /// The snapshot file, already written (an absolute path: a relative one is taken from
    /// the working directory). Recorded, the store owns it from then on: it deletes it with
    /// the event, on retention, or when a later snapshot replaces it.
    pub snapshot: Option<PathBuf>,
}

/// An event to record.
pub type NewEvent = Event;
/// An event as stored: its snapshot is the one attached last, or `None` once retention
/// took it.
pub type StoredEvent = Event;

impl Event {
    /// An event with only the required fields; the optional ones are `None`.
    pub fn new(
        id: impl Into<String>,
        stream: impl Into<String>,
        kind: impl Into<String>,
        at_ms: i64,
        payload: impl Into<String>,
    ) -> Self {
        Self {
            id: id.into(),
            stream: stream.into(),
            kind: kind.into(),
            label: None,
            track_id: None,
            zone: None,
            at_ms,
            score: None,
            payload: payload.into(),
            snapshot: None,
        }
    }

    /// Why this event cannot be stored, if it cannot.
    pub(crate) fn invalid_because(&self) -> Option<&'static str> {
        if let Some(reason) = id_invalid_because(&self.id) {
            return Some(reason);
        }
        if self.stream.is_empty() {
            return Some("the stream name is empty");
        }
        if self.kind.is_empty() {
            return Some("the event kind is empty");
        }
        match &self.snapshot {
            Some(path) => snapshot_path_invalid_because(path),
            None => None,
        }
    }
}

pub(crate) fn id_invalid_because(id: &str) -> Option<&'static str> {
    if id.is_empty() {
        Some("the id is empty")
    } else if id.len() > MAX_ID_BYTES {
        Some("the id is longer than 200 bytes")
    } else {
        None
    }
}

/// Paths are stored as text, so a path that is not UTF-8 could not be found again to delete.
pub(crate) fn snapshot_path_invalid_because(path: &Path) -> Option<&'static str> {
    if path.to_str().is_none() {
        Some("the snapshot path is not valid UTF-8")
    } else if path.as_os_str().is_empty() {
        Some("the snapshot path is empty")
    } else {
        None
    }
}

/// The columns [`Event::from_row`] reads, in its order.
pub(crate) const EVENT_COLUMNS: &str =
    "id, stream, kind, label, track_id, zone, at_ms, score, payload, snapshot";

impl Event {
    pub(crate) fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            id: row.get(0)?,
            stream: row.get(1)?,
            kind: row.get(2)?,
            label: row.get(3)?,
            track_id: row.get::<_, Option<i64>>(4)?.map(track_id_from_sql),
            zone: row.get(5)?,
            at_ms: row.get(6)?,
            score: row.get::<_, Option<f64>>(7)?.map(|score| score as f32),
            payload: row.get(8)?,
            snapshot: row.get::<_, Option<String>>(9)?.map(PathBuf::from),
        })
    }
}

/// SQLite integers are signed 64-bit; track ids travel through them bit for bit, so every
/// u64 comes back as it went in.
pub(crate) fn track_id_to_sql(track_id: u64) -> i64 {
    track_id as i64
}

fn track_id_from_sql(stored: i64) -> u64 {
    stored as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event() -> NewEvent {
        NewEvent::new("0192-a", "gate", "zone.enter", 0, "{}")
    }

    #[test]
    fn each_unstorable_event_says_why() {
        assert_eq!(event().invalid_because(), None);
        type Spoil = fn(&mut NewEvent);
        let cases: [(Spoil, &str); 5] = [
            (|e| e.id.clear(), "the id is empty"),
            (|e| e.id = "x".repeat(201), "the id is longer than 200 bytes"),
            (|e| e.stream.clear(), "the stream name is empty"),
            (|e| e.kind.clear(), "the event kind is empty"),
            (
                |e| e.snapshot = Some(PathBuf::new()),
                "the snapshot path is empty",
            ),
        ];
        for (spoil, reason) in cases {
            let mut e = event();
            spoil(&mut e);
            assert_eq!(e.invalid_because(), Some(reason));
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_snapshot_path_that_is_not_utf8_is_refused() {
        use std::os::unix::ffi::OsStrExt;
        let path = Path::new(std::ffi::OsStr::from_bytes(b"/tmp/\xff.jpg"));
        assert_eq!(
            snapshot_path_invalid_because(path),
            Some("the snapshot path is not valid UTF-8")
        );
    }

    #[test]
    fn track_ids_survive_the_signed_column_bit_for_bit() {
        for id in [0, 1, i64::MAX as u64, i64::MAX as u64 + 1, u64::MAX] {
            assert_eq!(track_id_from_sql(track_id_to_sql(id)), id);
        }
    }
}
