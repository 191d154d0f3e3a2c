//! The store through its public handle, on real database files in temporary directories:
//! filters, paging, deleting, snapshots, retention, restarts.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use peregrine_eventstore::{
    Cursor, Dropped, EventQuery, EventStore, NewEvent, RetentionReport, StoreConfig, StoreError,
};

const DAY_MS: i64 = 24 * 3600 * 1000;

/// A store in a fresh directory, without retention limits unless `limit` sets them.
fn store_with(limit: impl FnOnce(&mut StoreConfig)) -> (tempfile::TempDir, EventStore) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = unlimited(&dir.path().join("db/events.sqlite3"));
    limit(&mut config);
    let store = EventStore::open(config).unwrap();
    (dir, store)
}

fn unlimited(path: &Path) -> StoreConfig {
    StoreConfig {
        max_age: None,
        max_events: None,
        max_snapshot_bytes: None,
        ..StoreConfig::at(path)
    }
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

fn event(id: &str, at_ms: i64) -> NewEvent {
    NewEvent::new(id, "gate", "object.start", at_ms, format!(r#"{{"id":"{id}"}}"#))
}

/// A snapshot file of `bytes` bytes in `dir`.
fn snapshot(dir: &Path, name: &str, bytes: usize) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, vec![0xd8; bytes]).unwrap();
    path
}

/// Events "0", "1", ... captured at 0, 1, ... ms, each with a snapshot of `bytes` bytes.
fn record_with_snapshots(store: &EventStore, dir: &Path, count: usize, bytes: usize) -> Vec<PathBuf> {
    let files: Vec<PathBuf> = (0..count)
        .map(|n| snapshot(dir, &format!("{n}.jpg"), bytes))
        .collect();
    for (n, file) in files.iter().enumerate() {
        let at_ms = n as i64;
        store
            .record(NewEvent {
                snapshot: Some(file.clone()),
                ..event(&n.to_string(), at_ms)
            })
            .unwrap();
    }
    files
}

fn all(store: &EventStore, query: EventQuery) -> Vec<String> {
    let page = store.query(&EventQuery { limit: 1000, ..query }).unwrap();
    assert!(page.next.is_none());
    page.events.into_iter().map(|e| e.id).collect()
}

#[test]
fn every_field_comes_back_as_recorded() {
    let (dir, store) = store_with(|_| {});
    let recorded = NewEvent {
        label: Some("person".into()),
        track_id: Some(u64::MAX),
        zone: Some("dock".into()),
        score: Some(0.875),
        snapshot: Some(snapshot(dir.path(), "a.jpg", 10)),
        ..NewEvent::new("a", "cam-1", "zone.enter", -5, r#"{"k":"ü"}"#)
    };
    store.record(recorded.clone()).unwrap();
    store.flush().unwrap();
    assert_eq!(
        store.get("a").unwrap(),
        Some(recorded),
        "what is stored is what was recorded"
    );
    assert_eq!(store.get("b").unwrap(), None);
    assert_eq!(store.stats().written, 1);
}

#[test]
fn filters_combine_and_the_time_range_is_after_inclusive_before_exclusive() {
    let (_dir, store) = store_with(|_| {});
    let rows = [
        ("1", "gate", "zone.enter", Some("person"), Some("dock"), 10),
        ("2", "gate", "zone.exit", Some("person"), Some("dock"), 20),
        ("3", "gate", "line.cross", Some("car"), None, 30),
        ("4", "yard", "zone.enter", Some("car"), Some("dock"), 40),
        ("5", "yard", "object.start", None, None, 50),
    ];
    for (id, stream, kind, label, zone, at_ms) in rows {
        store
            .record(NewEvent {
                label: label.map(Into::into),
                zone: zone.map(Into::into),
                ..NewEvent::new(id, stream, kind, at_ms, "{}")
            })
            .unwrap();
    }
    store.flush().unwrap();
    // ([stream, label, zone, kind], [after_ms, before_ms]) and the ids it finds.
    type Filters = ([Option<&'static str>; 4], [Option<i64>; 2]);
    let cases: [(Filters, Vec<&str>); 10] = [
        (
            ([None, None, None, None], [None, None]),
            vec!["5", "4", "3", "2", "1"],
        ),
        (
            ([Some("gate"), None, None, None], [None, None]),
            vec!["3", "2", "1"],
        ),
        (([None, Some("car"), None, None], [None, None]), vec!["4", "3"]),
        (
            ([None, None, Some("dock"), None], [None, None]),
            vec!["4", "2", "1"],
        ),
        (
            ([None, None, None, Some("zone.enter")], [None, None]),
            vec!["4", "1"],
        ),
        (
            (
                [Some("gate"), None, Some("dock"), Some("zone.exit")],
                [None, None],
            ),
            vec!["2"],
        ),
        (([None, None, None, None], [Some(20), Some(40)]), vec!["3", "2"]),
        (([None, None, None, None], [Some(50), None]), vec!["5"]),
        (([None, None, None, None], [None, Some(10)]), vec![]),
        (([None, Some("dog"), None, None], [None, None]), vec![]),
    ];
    for (([stream, label, zone, kind], [after_ms, before_ms]), expected) in cases {
        let owned = |text: Option<&str>| text.map(str::to_owned);
        let query = EventQuery {
            stream: owned(stream),
            label: owned(label),
            zone: owned(zone),
            kind: owned(kind),
            after_ms,
            before_ms,
            ..EventQuery::default()
        };
        assert_eq!(all(&store, query.clone()), expected, "{query:?}");
    }
}

#[test]
fn pages_walk_newest_first_without_duplicates_or_gaps_while_new_events_arrive() {
    let (_dir, store) = store_with(|_| {});
    // Three events per millisecond: the id breaks ties.
    let first: Vec<NewEvent> = (0..250)
        .map(|n| event(&format!("old-{n:03}"), 1_000 + n / 3))
        .collect();
    for e in &first {
        store.record(e.clone()).unwrap();
    }
    store.flush().unwrap();
    let mut expected: Vec<(i64, String)> = first.iter().map(|e| (e.at_ms, e.id.clone())).collect();
    expected.sort_by(|a, b| b.cmp(a));

    let mut walked = Vec::new();
    let mut cursor: Option<Cursor> = None;
    for page_number in 0.. {
        let query = EventQuery {
            limit: 40,
            cursor: cursor.take(),
            ..Default::default()
        };
        let page = store.query(&query).unwrap();
        assert!(page.events.len() <= 40);
        walked.extend(page.events.iter().map(|e| (e.at_ms, e.id.clone())));
        // Newer events land above the first page meanwhile, committed before the next one.
        store
            .record(event(&format!("new-{page_number}"), 5_000 + page_number))
            .unwrap();
        store.flush().unwrap();
        match page.next {
            // Through its text form, as a client would carry it.
            Some(next) => cursor = Some(next.to_string().parse().unwrap()),
            None => break,
        }
    }
    assert_eq!(walked, expected);
    let distinct: HashSet<_> = walked.iter().collect();
    assert_eq!(distinct.len(), 250);
    let newest = store
        .query(&EventQuery {
            limit: 1,
            ..Default::default()
        })
        .unwrap();
    assert!(
        newest.events[0].id.starts_with("new-"),
        "the new events are on top"
    );
}

#[test]
fn limits_out_of_range_and_empty_time_ranges_are_bad_requests() {
    let (_dir, store) = store_with(|_| {});
    for limit in [0, 1001] {
        let error = store
            .query(&EventQuery {
                limit,
                ..Default::default()
            })
            .unwrap_err();
        assert!(
            matches!(error, StoreError::LimitOutOfRange(l) if l == limit),
            "{error}"
        );
        assert!(error.is_bad_request());
    }
    let empty = EventQuery {
        after_ms: Some(5),
        before_ms: Some(5),
        ..Default::default()
    };
    let error = store.query(&empty).unwrap_err();
    assert!(
        error.is_bad_request() && error.to_string().contains("must be earlier"),
        "{error}"
    );
}

#[test]
fn invalid_and_duplicate_events_are_refused_and_counted() {
    let (_dir, store) = store_with(|_| {});
    let error = store
        .record(NewEvent::new("", "gate", "object.start", 1, "{}"))
        .unwrap_err();
    assert_eq!(
        error,
        Dropped::Invalid {
            id: String::new(),
            reason: "the id is empty"
        }
    );
    store.record(event("same", 1)).unwrap();
    store
        .record(NewEvent {
            payload: "second".into(),
            ..event("same", 2)
        })
        .unwrap();
    store.flush().unwrap();
    let stats = store.stats();
    assert_eq!((stats.written, stats.rejected), (1, 2));
    assert!(stats.last_error.unwrap().contains("duplicate event id \"same\""));
    assert_eq!(
        store.get("same").unwrap().unwrap().at_ms,
        1,
        "the first one stays"
    );
}

#[test]
fn delete_removes_the_row_and_its_snapshot_file() {
    let (dir, store) = store_with(|_| {});
    let file = snapshot(dir.path(), "a.jpg", 100);
    store
        .record(NewEvent {
            snapshot: Some(file.clone()),
            ..event("a", 1)
        })
        .unwrap();
    store.record(event("b", 2)).unwrap();
    // No flush: delete commits what was queued before it.
    assert!(store.delete("a").unwrap());
    assert!(!file.exists());
    assert_eq!(store.get("a").unwrap(), None);
    assert!(!store.delete("a").unwrap(), "already gone");
    assert!(store.delete("b").unwrap(), "an event without a snapshot");
    assert_eq!(store.stats().snapshots_deleted, 1);
}

#[test]
fn a_later_snapshot_replaces_and_deletes_the_earlier_one() {
    let (dir, store) = store_with(|_| {});
    store.record(event("a", 1)).unwrap();
    let first = snapshot(dir.path(), "first.jpg", 10);
    let second = snapshot(dir.path(), "second.jpg", 10);
    store.attach_snapshot("a", first.clone()).unwrap();
    store.flush().unwrap();
    assert_eq!(store.get("a").unwrap().unwrap().snapshot, Some(first.clone()));
    store.attach_snapshot("a", second.clone()).unwrap();
    store.flush().unwrap();
    assert_eq!(store.get("a").unwrap().unwrap().snapshot, Some(second.clone()));
    assert!(!first.exists() && second.exists());

    let orphan = snapshot(dir.path(), "orphan.jpg", 10);
    store.attach_snapshot("never-recorded", orphan.clone()).unwrap();
    store.flush().unwrap();
    assert!(
        !orphan.exists(),
        "the store took the file over and had no event for it"
    );
    assert_eq!(store.stats().rejected, 1);

    store
        .attach_snapshot("a", dir.path().join("never-written.jpg"))
        .unwrap();
    store.flush().unwrap();
    assert_eq!(
        store.get("a").unwrap().unwrap().snapshot,
        Some(second),
        "a missing file is not attached"
    );
    let stats = store.stats();
    assert_eq!(stats.rejected, 2);
    assert!(stats.last_error.unwrap().contains("never-written.jpg"));
}

#[test]
fn retention_removes_events_older_than_the_age_limit_and_their_files() {
    let (dir, store) = store_with(|c| c.max_age = Some(Duration::from_secs(7 * 24 * 3600)));
    let old_file = snapshot(dir.path(), "old.jpg", 10);
    let now = now_ms();
    store
        .record(NewEvent {
            snapshot: Some(old_file.clone()),
            ..event("old", now - 8 * DAY_MS)
        })
        .unwrap();
    store.record(event("recent", now - DAY_MS)).unwrap();
    let report = store.run_retention().unwrap();
    assert_eq!(
        report,
        RetentionReport {
            events_removed: 1,
            snapshots_removed: 1
        }
    );
    assert!(!old_file.exists());
    assert_eq!(all(&store, EventQuery::default()), ["recent"]);
    assert_eq!(store.stats().removed_by_retention, 1);
}

#[test]
fn retention_keeps_the_newest_events_up_to_the_count_limit() {
    let (dir, store) = store_with(|c| c.max_events = Some(3));
    let files = record_with_snapshots(&store, dir.path(), 5, 10);
    assert_eq!(store.run_retention().unwrap().events_removed, 2);
    assert_eq!(all(&store, EventQuery::default()), ["4", "3", "2"]);
    let exists: Vec<bool> = files.iter().map(|f| f.exists()).collect();
    assert_eq!(exists, [false, false, true, true, true]);
}

#[test]
fn retention_deletes_the_oldest_snapshots_past_the_byte_limit_and_keeps_their_events() {
    let (dir, store) = store_with(|c| c.max_snapshot_bytes = Some(250));
    let files = record_with_snapshots(&store, dir.path(), 4, 100);
    let report = store.run_retention().unwrap();
    assert_eq!(
        report,
        RetentionReport {
            events_removed: 0,
            snapshots_removed: 2
        }
    );
    let exists: Vec<bool> = files.iter().map(|f| f.exists()).collect();
    assert_eq!(exists, [false, false, true, true]);
    assert_eq!(store.get("0").unwrap().unwrap().snapshot, None, "the event stays");
    assert_eq!(all(&store, EventQuery::default()).len(), 4);
}

#[test]
fn events_survive_a_restart_and_retention_applies_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.sqlite3");
    let store = EventStore::open(unlimited(&path)).unwrap();
    let now = now_ms();
    store.record(event("old", now - 30 * DAY_MS)).unwrap();
    store.record(event("recent", now)).unwrap();
    store.close().unwrap();

    let reopened = EventStore::open(unlimited(&path)).unwrap();
    assert_eq!(all(&reopened, EventQuery::default()), ["recent", "old"]);
    drop(reopened);

    let with_age_limit = StoreConfig {
        max_age: Some(Duration::from_secs(7 * 24 * 3600)),
        ..unlimited(&path)
    };
    let reopened = EventStore::open(with_age_limit).unwrap();
    // The writer's first pass runs before it takes any command, so a flush sees it done.
    reopened.flush().unwrap();
    assert_eq!(all(&reopened, EventQuery::default()), ["recent"]);
}

#[test]
fn a_store_that_cannot_be_opened_says_which_path() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, "").unwrap();
    let error = EventStore::open(StoreConfig::at(blocker.join("events.sqlite3"))).unwrap_err();
    assert!(matches!(error, StoreError::CreateDir { .. }), "{error}");
    assert!(error.to_string().contains(&*blocker.to_string_lossy()), "{error}");
}
