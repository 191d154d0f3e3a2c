//! Retention: which rows and snapshots go when the store is over its limits. Runs inside
//! the writer's transaction with the time passed in; the snapshot files are removed by the
//! writer only after the transaction commits (a crash in between leaves an orphan file,
//! never a row pointing at a missing one).

use std::path::PathBuf;
use std::time::Duration;

use rusqlite::{params, Transaction};

use crate::config::StoreConfig;

/// The limits, taken from [`StoreConfig`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RetentionLimits {
    pub(crate) max_age: Option<Duration>,
    pub(crate) max_events: Option<u64>,
    pub(crate) max_snapshot_bytes: Option<u64>,
}

impl RetentionLimits {
    pub(crate) fn of(config: &StoreConfig) -> Self {
        Self {
            max_age: config.max_age,
            max_events: config.max_events,
            max_snapshot_bytes: config.max_snapshot_bytes,
        }
    }
}

/// What one retention pass removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionReport {
    /// Rows deleted for age or count.
    pub events_removed: u64,
    /// Snapshot files given up: those of deleted rows, and the oldest ones past the byte
    /// limit (whose events stay).
    pub snapshots_removed: u64,
}

/// Deletes what is over the limits, oldest capture time first: rows older than `max_age`,
/// then the oldest rows past `max_events`, then the oldest snapshots until those left add
/// up to `max_snapshot_bytes`. Returns the report and the snapshot files to remove.
pub(crate) fn apply(
    tx: &Transaction<'_>,
    limits: &RetentionLimits,
    now_ms: i64,
) -> rusqlite::Result<(RetentionReport, Vec<PathBuf>)> {
    let mut report = RetentionReport::default();
    let mut files = Vec::new();
    let mut note_deleted = |snapshots: Vec<Option<String>>, files: &mut Vec<PathBuf>| {
        report.events_removed += snapshots.len() as u64;
        files.extend(snapshots.into_iter().flatten().map(PathBuf::from));
    };
    if let Some(max_age) = limits.max_age {
        let max_age_ms = i64::try_from(max_age.as_millis()).unwrap_or(i64::MAX);
        let cutoff_ms = now_ms.saturating_sub(max_age_ms);
        let deleted = returned_snapshots(
            tx,
            "DELETE FROM events WHERE at_ms < ?1 RETURNING snapshot",
            params![cutoff_ms],
        )?;
        note_deleted(deleted, &mut files);
    }
    if let Some(max_events) = limits.max_events {
        let count: i64 = tx.query_row("SELECT COUNT(*) FROM events", [], |row| row.get(0))?;
        let count = u64::try_from(count).unwrap_or(0);
        let excess = count.saturating_sub(max_events);
        if excess > 0 {
            let deleted = returned_snapshots(
                tx,
                "DELETE FROM events WHERE seq IN
                   (SELECT seq FROM events ORDER BY at_ms, id LIMIT ?1)
                 RETURNING snapshot",
                params![excess as i64],
            )?;
            note_deleted(deleted, &mut files);
        }
    }
    if let Some(max_bytes) = limits.max_snapshot_bytes {
        files.extend(drop_snapshots_over(tx, max_bytes)?);
    }
    report.snapshots_removed = files.len() as u64;
    Ok((report, files))
}

/// Clears the snapshots of the oldest events until the newest ones left add up to at most
/// `max_bytes`; returns the cleared files.
fn drop_snapshots_over(tx: &Transaction<'_>, max_bytes: u64) -> rusqlite::Result<Vec<PathBuf>> {
    let mut over = tx.prepare(
        "SELECT seq, snapshot FROM (
           SELECT seq, snapshot, SUM(snapshot_bytes) OVER (
             ORDER BY at_ms DESC, id DESC ROWS UNBOUNDED PRECEDING) AS bytes_to_here
           FROM events WHERE snapshot IS NOT NULL)
         WHERE bytes_to_here > ?1",
    )?;
    let rows = over
        .query_map(params![i64::try_from(max_bytes).unwrap_or(i64::MAX)], |row| {
            Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut clear = tx.prepare("UPDATE events SET snapshot = NULL, snapshot_bytes = NULL WHERE seq = ?1")?;
    let mut files = Vec::with_capacity(rows.len());
    for (seq, path) in rows {
        clear.execute([seq])?;
        files.push(PathBuf::from(path));
    }
    Ok(files)
}

/// Runs a `DELETE ... RETURNING snapshot` and collects what it returned, one per row.
fn returned_snapshots(
    tx: &Transaction<'_>,
    sql: &str,
    params: impl rusqlite::Params,
) -> rusqlite::Result<Vec<Option<String>>> {
    let mut statement = tx.prepare(sql)?;
    let rows = statement.query_map(params, |row| row.get(0))?;
    rows.collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::Connection;

    const DAY_MS: i64 = 24 * 3600 * 1000;

    /// A database with one event per `(id, at_ms, snapshot bytes)`.
    fn database(events: &[(&str, i64, Option<u64>)]) -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::schema::open_writer(&dir.path().join("events.sqlite3")).unwrap();
        for (id, at_ms, bytes) in events {
            conn.execute(
                "INSERT INTO events (id, stream, kind, at_ms, payload, snapshot, snapshot_bytes)
                 VALUES (?1, 'gate', 'object.end', ?2, '{}', ?3, ?4)",
                params![
                    id,
                    at_ms,
                    bytes.map(|_| format!("{id}.jpg")),
                    bytes.map(|b| b as i64)
                ],
            )
            .unwrap();
        }
        (dir, conn)
    }

    fn apply_limits(
        conn: &mut Connection,
        limits: RetentionLimits,
        now_ms: i64,
    ) -> (RetentionReport, Vec<PathBuf>) {
        let tx = conn.transaction().unwrap();
        let outcome = apply(&tx, &limits, now_ms).unwrap();
        tx.commit().unwrap();
        outcome
    }

    fn remaining(conn: &Connection) -> Vec<(String, Option<String>)> {
        let mut statement = conn
            .prepare("SELECT id, snapshot FROM events ORDER BY at_ms")
            .unwrap();
        let rows = statement
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .unwrap();
        rows.map(Result::unwrap).collect()
    }

    const NO_LIMITS: RetentionLimits = RetentionLimits {
        max_age: None,
        max_events: None,
        max_snapshot_bytes: None,
    };

    #[test]
    fn rows_older_than_the_age_limit_go_with_their_snapshots() {
        let now_ms = 100 * DAY_MS;
        let (_dir, mut conn) = database(&[
            ("old", now_ms - 8 * DAY_MS, Some(10)),
            ("edge", now_ms - 7 * DAY_MS, None),
            ("new", now_ms - 1, Some(10)),
        ]);
        let limits = RetentionLimits {
            max_age: Some(Duration::from_secs(7 * 24 * 3600)),
            ..NO_LIMITS
        };
        let (report, files) = apply_limits(&mut conn, limits, now_ms);
        assert_eq!(
            report,
            RetentionReport {
                events_removed: 1,
                snapshots_removed: 1
            }
        );
        assert_eq!(files, vec![PathBuf::from("old.jpg")]);
        let ids: Vec<_> = remaining(&conn).into_iter().map(|(id, _)| id).collect();
        assert_eq!(ids, ["edge", "new"], "exactly max_age old is kept");
    }

    #[test]
    fn past_the_count_limit_the_oldest_rows_go() {
        let (_dir, mut conn) = database(&[("c", 3, None), ("a", 1, Some(5)), ("b", 2, None), ("d", 4, None)]);
        let limits = RetentionLimits {
            max_events: Some(2),
            ..NO_LIMITS
        };
        let (report, files) = apply_limits(&mut conn, limits, 0);
        assert_eq!(
            report,
            RetentionReport {
                events_removed: 2,
                snapshots_removed: 1
            }
        );
        assert_eq!(files, vec![PathBuf::from("a.jpg")]);
        assert_eq!(remaining(&conn), [("c".into(), None), ("d".into(), None)]);
        let (report, _) = apply_limits(&mut conn, limits, 0);
        assert_eq!(
            report,
            RetentionReport::default(),
            "at the limit nothing more goes"
        );
    }

    #[test]
    fn past_the_byte_limit_the_oldest_snapshots_go_and_their_events_stay() {
        let (_dir, mut conn) = database(&[
            ("a", 1, Some(40)),
            ("b", 2, Some(40)),
            ("c", 3, None),
            ("d", 4, Some(30)),
            ("e", 5, Some(30)),
        ]);
        let limits = RetentionLimits {
            max_snapshot_bytes: Some(100),
            ..NO_LIMITS
        };
        let (report, files) = apply_limits(&mut conn, limits, 0);
        assert_eq!(
            report,
            RetentionReport {
                events_removed: 0,
                snapshots_removed: 1
            }
        );
        assert_eq!(files, vec![PathBuf::from("a.jpg")], "30 + 30 + 40 = 100 fit");
        let snapshots: Vec<_> = remaining(&conn).into_iter().map(|(_, s)| s).collect();
        assert_eq!(
            snapshots,
            [
                None,
                Some("b.jpg".into()),
                None,
                Some("d.jpg".into()),
                Some("e.jpg".into())
            ]
        );
        let (report, _) = apply_limits(
            &mut conn,
            RetentionLimits {
                max_snapshot_bytes: Some(0),
                ..NO_LIMITS
            },
            0,
        );
        assert_eq!(report.snapshots_removed, 3);
        assert_eq!(remaining(&conn).len(), 5);
    }

    #[test]
    fn without_limits_nothing_goes() {
        let (_dir, mut conn) = database(&[("a", i64::MIN, Some(u64::MAX >> 2)), ("b", 0, Some(1))]);
        let (report, files) = apply_limits(&mut conn, NO_LIMITS, i64::MAX);
        assert_eq!((report, files), (RetentionReport::default(), vec![]));
        assert_eq!(remaining(&conn).len(), 2);
    }
}
