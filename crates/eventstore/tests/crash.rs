//! kill -9 mid-write: a child process records events without pause and prints the ids each
//! flush confirmed; the test kills it with SIGKILL while it writes, reopens the database,
//! checks SQLite's integrity and that every confirmed event is there, and does it again on
//! the same file.
//!
//! The child is this test binary itself, run again with only the ignored test
//! `child_records_until_killed` selected: no second binary to build or find.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use peregrine_eventstore::{EventQuery, EventStore, NewEvent, StoreConfig};

/// Where the child writes; set only in the child's environment.
const DATABASE_VARIABLE: &str = "PEREGRINE_EVENTSTORE_CRASH_DB";
/// Which run of the child this is, to keep its ids apart from the previous runs'.
const ROUND_VARIABLE: &str = "PEREGRINE_EVENTSTORE_CRASH_ROUND";
const CONFIRMED: &str = "confirmed ";
const ROUNDS: usize = 3;
/// Confirmed events to see before each kill.
const CONFIRMED_BEFORE_KILL: usize = 200;

fn config(path: &Path) -> StoreConfig {
    StoreConfig {
        flush_interval: Duration::from_millis(50),
        max_age: None,
        max_events: None,
        max_snapshot_bytes: None,
        ..StoreConfig::at(path)
    }
}

#[test]
fn a_kill_9_mid_write_keeps_every_confirmed_event_and_never_corrupts_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.sqlite3");
    let mut confirmed = HashSet::new();
    for round in 0..ROUNDS {
        confirmed.extend(run_child_until_killed(&path, round));
        // The kill left a write-ahead log behind (no checkpoint on the way out): opening
        // has to recover from it.
        let wal = std::fs::metadata(path.with_extension("sqlite3-wal")).map_or(0, |m| m.len());
        assert!(
            wal > 0,
            "round {round}: no write-ahead log left by the killed writer"
        );

        let conn = rusqlite::Connection::open(&path).unwrap();
        let integrity: String = conn
            .query_row("PRAGMA integrity_check", [], |row| row.get(0))
            .unwrap();
        assert_eq!(integrity, "ok", "round {round}");
        drop(conn);

        let store = EventStore::open(config(&path)).unwrap();
        let stored = stored_ids(&store);
        let missing: Vec<_> = confirmed.difference(&stored).take(5).collect();
        assert!(
            missing.is_empty(),
            "round {round}: confirmed but not stored: {missing:?}"
        );
        let unconfirmed = stored.len() - confirmed.len();
        eprintln!(
            "round {round}: {} confirmed, {unconfirmed} more committed unconfirmed",
            confirmed.len()
        );
        store.close().unwrap();
    }
}

/// Starts the child, reads its confirmations until enough have come, kills it, and returns
/// every id it confirmed.
fn run_child_until_killed(path: &Path, round: usize) -> HashSet<String> {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "child_records_until_killed",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(DATABASE_VARIABLE, path)
        .env(ROUND_VARIABLE, round.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let (lines, confirmations) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let mut confirmed = HashSet::new();
    while confirmed.len() < CONFIRMED_BEFORE_KILL {
        let line = confirmations
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| {
                panic!(
                    "round {round}: the child stopped confirming at {}",
                    confirmed.len()
                )
            });
        if let Some(id) = line.strip_prefix(CONFIRMED) {
            confirmed.insert(id.to_owned());
        }
    }
    // SIGKILL on Unix: no destructor, no flush, no checkpoint.
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert!(!status.success(), "the child was killed, not finished");
    // Confirmations printed before the kill landed count too.
    reader.join().unwrap();
    confirmed.extend(
        confirmations
            .try_iter()
            .filter_map(|line| line.strip_prefix(CONFIRMED).map(str::to_owned)),
    );
    confirmed
}

fn stored_ids(store: &EventStore) -> HashSet<String> {
    let mut ids = HashSet::new();
    let mut cursor = None;
    loop {
        let page = store
            .query(&EventQuery {
                limit: 1000,
                cursor,
                ..Default::default()
            })
            .unwrap();
        ids.extend(page.events.into_iter().map(|event| event.id));
        match page.next {
            Some(next) => cursor = Some(next),
            None => return ids,
        }
    }
}

/// The child: one thread records bulk events 500 at a time and flushes (so the writer is
/// nearly always mid-transaction), the main thread records 20 at a time and prints their ids
/// once `flush` has returned. Runs until killed.
#[test]
#[ignore = "the child process of the kill -9 test, which starts it"]
fn child_records_until_killed() {
    let Some(path) = std::env::var_os(DATABASE_VARIABLE) else {
        return;
    };
    let round = std::env::var(ROUND_VARIABLE).unwrap();
    let store = EventStore::open(config(Path::new(&path))).unwrap();
    // Half a kilobyte per event, so each transaction spans many pages.
    let payload = "x".repeat(512);
    let record_and_flush = {
        let payload = payload.clone();
        move |store: &EventStore, ids: &[String], stream: &str| {
            for (n, id) in ids.iter().enumerate() {
                let event = NewEvent::new(id.as_str(), stream, "object.start", n as i64, payload.as_str());
                store
                    .record(event)
                    .expect("the queue has room: each burst is flushed");
            }
            store.flush().unwrap();
        }
    };
    let background = store.clone();
    let background_round = round.clone();
    let bulk_record_and_flush = record_and_flush.clone();
    std::thread::spawn(move || {
        for burst in 0u64.. {
            let ids: Vec<String> = (0..500)
                .map(|n| format!("r{background_round}-bulk-{burst:06}-{n:03}"))
                .collect();
            bulk_record_and_flush(&background, &ids, "bulk");
        }
    });
    let mut stdout = std::io::stdout().lock();
    for batch in 0u64.. {
        let ids: Vec<String> = (0..20)
            .map(|n| format!("r{round}-confirmed-{batch:06}-{n:02}"))
            .collect();
        record_and_flush(&store, &ids, "confirmed");
        for id in &ids {
            writeln!(stdout, "{CONFIRMED}{id}").unwrap();
        }
        stdout.flush().unwrap();
    }
}
