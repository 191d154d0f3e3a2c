//! The handle's behaviour when the writer falls behind, made deterministic by holding the
//! writer (a test-only command) instead of hoping a disk is slow.

use super::*;

fn store(queue_capacity: usize) -> (tempfile::TempDir, EventStore) {
    let dir = tempfile::tempdir().unwrap();
    let config = StoreConfig {
        queue_capacity,
        ..StoreConfig::at(dir.path().join("events.sqlite3"))
    };
    let store = EventStore::open(config).unwrap();
    (dir, store)
}

fn event(n: usize) -> NewEvent {
    NewEvent::new(format!("e{n:03}"), "gate", "object.start", n as i64, "{}")
}

#[test]
fn a_full_queue_drops_and_counts_without_waiting_and_what_was_queued_is_written() {
    let (_dir, store) = store(4);
    let hold = store.hold_writer();
    for n in 0..4 {
        store.record(event(n)).unwrap();
    }
    assert_eq!(store.record(event(4)), Err(Dropped::QueueFull { capacity: 4 }));
    let attached = store.attach_snapshot("e000", PathBuf::from("/nowhere/e000.jpg"));
    assert_eq!(attached, Err(Dropped::QueueFull { capacity: 4 }));
    let stats = store.stats();
    assert_eq!((stats.dropped, stats.queued, stats.written), (2, 4, 0));
    drop(hold);
    store.flush().unwrap();
    let stats = store.stats();
    assert_eq!((stats.dropped, stats.queued, stats.written), (2, 0, 4));
    assert!(store.get("e003").unwrap().is_some());
    assert!(
        store.get("e004").unwrap().is_none(),
        "the dropped event was not written"
    );
}

#[test]
fn a_flush_waits_for_the_writer_to_commit_what_was_queued_before_it() {
    let (_dir, store) = store(100);
    let hold = store.hold_writer();
    store.record(event(1)).unwrap();
    let flushed = std::thread::scope(|scope| {
        let flushing = scope.spawn(|| store.flush());
        // The flush is queued behind the event; the writer is held, so neither is done.
        assert!(store.get("e001").unwrap().is_none());
        drop(hold);
        flushing.join().unwrap()
    });
    flushed.unwrap();
    assert!(store.get("e001").unwrap().is_some());
}

#[test]
fn the_last_handle_dropped_commits_what_is_queued() {
    let (dir, store) = store(100);
    let clone = store.clone();
    let hold = store.hold_writer();
    clone.record(event(7)).unwrap();
    drop(clone);
    drop(hold);
    drop(store);
    let reopened = EventStore::open(StoreConfig::at(dir.path().join("events.sqlite3"))).unwrap();
    assert!(reopened.get("e007").unwrap().is_some());
}

#[test]
fn the_handle_can_be_shared_across_threads_and_tasks() {
    fn shareable<T: Clone + Send + Sync + 'static>() {}
    shareable::<EventStore>();
}

#[test]
fn a_batch_the_disk_cannot_take_is_counted_lost_and_reported_by_the_next_flush_once() {
    let (_dir, store) = store(10_000);
    store.record(event(0)).unwrap();
    store.flush().unwrap();
    // The file may not grow past its current pages: the next inserts find the disk full.
    store.on_writer(|conn| {
        let pages: i64 = conn.query_row("PRAGMA page_count", [], |row| row.get(0)).unwrap();
        conn.pragma_update(None, "max_page_count", pages).unwrap();
    });
    let big = "x".repeat(4096);
    for n in 1..=50 {
        store
            .record(NewEvent {
                payload: big.clone(),
                ..event(n)
            })
            .unwrap();
    }
    let error = store.flush().unwrap_err();
    assert!(
        matches!(error, StoreError::EventsLost { events: 50, .. }),
        "{error}"
    );
    let stats = store.stats();
    assert_eq!((stats.written, stats.failed), (1, 50));
    assert!(stats.last_error.unwrap().contains("full"));
    store.flush().expect("the loss was reported once");

    store.on_writer(|conn| {
        conn.pragma_update(None, "max_page_count", 1 << 30).unwrap();
    });
    store.record(event(51)).unwrap();
    store.flush().unwrap();
    assert!(
        store.get("e051").unwrap().is_some(),
        "the writer goes on after a failed batch"
    );
    assert!(store.get("e001").unwrap().is_none());
}
