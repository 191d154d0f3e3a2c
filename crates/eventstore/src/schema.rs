//! Opening the database file: connection settings, and the schema migrations numbered by
//! `PRAGMA user_version`.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use crate::error::StoreError;

/// The schema, one step per version: step `n` (from 0) brings a database from version `n` to
/// `n + 1`. Steps are only ever appended, never edited: a database written by an older build
/// is upgraded by the steps it has not had.
const MIGRATIONS: &[&str] = &[
    // 1: events, the indexes of the newest-first queries (one per filter, each ending in the
    // order key so the index walks in page order), and the snapshots retention walks by age.
    "CREATE TABLE events (
        seq INTEGER PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        stream TEXT NOT NULL,
        kind TEXT NOT NULL,
        label TEXT,
        track_id INTEGER,
        zone TEXT,
        at_ms INTEGER NOT NULL,
        score REAL,
        payload TEXT NOT NULL,
        snapshot TEXT,
        snapshot_bytes INTEGER
    );
    CREATE INDEX events_by_time ON events (at_ms, id);
    CREATE INDEX events_by_stream ON events (stream, at_ms, id);
    CREATE INDEX events_by_label ON events (label, at_ms, id);
    CREATE INDEX events_by_zone ON events (zone, at_ms, id);
    CREATE INDEX events_by_kind ON events (kind, at_ms, id);
    CREATE INDEX snapshots_by_time ON events (at_ms, id) WHERE snapshot IS NOT NULL;",
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: usize = MIGRATIONS.len();

/// How long a statement waits for a lock another connection holds (a checkpoint, WAL
/// recovery at open) before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens (creating if needed) the one read-write connection, in WAL mode with every commit
/// synced, and brings the schema up to date.
///
/// `synchronous = FULL`: a commit is on disk before it returns, so a power cut, not only a
/// killed process, loses at most the batch being written. Batching makes that one sync per
/// flush interval.
pub(crate) fn open_writer(path: &Path) -> Result<Connection, StoreError> {
    let open_error = |source| StoreError::Open {
        path: path.to_owned(),
        source,
    };
    let mut conn = Connection::open(path).map_err(open_error)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(open_error)?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .map_err(open_error)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::NoWal {
            path: path.to_owned(),
            mode,
        });
    }
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(open_error)?;
    migrate(&mut conn, path)?;
    Ok(conn)
}

/// A connection that can only read, for queries beside the writer.
pub(crate) fn open_reader(path: &Path) -> Result<Connection, StoreError> {
    let open_error = |source| StoreError::Open {
        path: path.to_owned(),
        source,
    };
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(open_error)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(open_error)?;
    Ok(conn)
}

/// Applies the steps the database has not had, all in one transaction with the new version
/// number, so a crash mid-migration leaves the old version intact.
fn migrate(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let found: i64 = conn
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(|source| StoreError::Open {
            path: path.to_owned(),
            source,
        })?;
    if found > SCHEMA_VERSION as i64 {
        return Err(StoreError::SchemaTooNew {
            path: path.to_owned(),
            found,
            supported: SCHEMA_VERSION as i64,
        });
    }
    let from = usize::try_from(found).unwrap_or(0);
    if from == SCHEMA_VERSION {
        return Ok(());
    }
    let migrate_error = |source| StoreError::Migrate {
        path: path.to_owned(),
        version: SCHEMA_VERSION,
        source,
    };
    let tx = conn.transaction().map_err(migrate_error)?;
    for step in &MIGRATIONS[from..] {
        tx.execute_batch(step).map_err(migrate_error)?;
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION as i64)
        .map_err(migrate_error)?;
    tx.commit().map_err(migrate_error)?;
    tracing::info!(path = %path.display(), from, to = SCHEMA_VERSION, "event database schema upgraded");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user_version(conn: &Connection) -> i64 {
        conn.pragma_query_value(None, "user_version", |row| row.get(0))
            .unwrap()
    }

    #[test]
    fn an_empty_file_is_migrated_to_the_current_version_and_reopening_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.sqlite3");
        std::fs::write(&path, b"").unwrap();
        let conn = open_writer(&path).unwrap();
        assert_eq!(user_version(&conn), SCHEMA_VERSION as i64);
        conn.execute(
            "INSERT INTO events (id, stream, kind, at_ms, payload) VALUES ('a', 's', 'k', 1, '{}')",
            [],
        )
        .unwrap();
        drop(conn);
        let conn = open_writer(&path).unwrap();
        assert_eq!(user_version(&conn), SCHEMA_VERSION as i64);
        let rows: i64 = conn
            .query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 1, "reopening kept the row (no migration ran again)");
        let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
        assert_eq!(mode, "wal");
    }

    #[test]
    fn a_database_from_a_newer_build_is_refused_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.sqlite3");
        Connection::open(&path)
            .unwrap()
            .pragma_update(None, "user_version", 99)
            .unwrap();
        let error = open_writer(&path).unwrap_err();
        assert!(
            matches!(error, StoreError::SchemaTooNew { found: 99, .. }),
            "{error}"
        );
        assert!(error.to_string().contains("schema version 99"), "{error}");
        assert_eq!(user_version(&Connection::open(&path).unwrap()), 99);
    }

    #[test]
    fn a_file_that_is_not_a_database_is_refused_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notes.txt");
        std::fs::write(&path, "these are not the events you are looking for, not at all").unwrap();
        let message = open_writer(&path).unwrap_err().to_string();
        assert!(message.contains(&*path.to_string_lossy()), "{message}");
        assert!(message.contains("not a database"), "{message}");
    }
}
