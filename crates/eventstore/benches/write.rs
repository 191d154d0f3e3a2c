//! Write throughput (events per second from `record` to committed, synced rows) and the
//! time of one filtered page from a store at its default event limit.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use peregrine_eventstore::{EventQuery, EventStore, NewEvent, StoreConfig};

/// Events recorded, then flushed, per iteration.
const BURST: usize = 10_000;
/// Events in the store the query bench reads from (the default `max_events`).
const STORED: usize = 100_000;

/// About the size of a zone event's JSON.
fn payload(n: usize) -> String {
    format!(
        r#"{{"type":"zone.enter","stream":"cam-{}","track_id":{n},"label":"person","zone":"dock","score":0.87,"box":[120.5,88.0,310.25,400.0],"at":"2026-12-02T01:00:00.000Z"}}"#,
        n % 4
    )
}

fn event(n: usize) -> NewEvent {
    NewEvent {
        label: Some(if n.is_multiple_of(3) { "car" } else { "person" }.into()),
        track_id: Some(n as u64),
        zone: Some("dock".into()),
        score: Some(0.87),
        ..NewEvent::new(
            format!("ev-{n:012}"),
            format!("cam-{}", n % 4),
            "zone.enter",
            n as i64,
            payload(n),
        )
    }
}

fn store(dir: &tempfile::TempDir) -> EventStore {
    EventStore::open(StoreConfig {
        max_age: None,
        max_events: None,
        queue_capacity: BURST,
        ..StoreConfig::at(dir.path().join("events.sqlite3"))
    })
    .unwrap()
}

fn bench_write(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir);
    let mut next = 0;
    let mut group = c.benchmark_group("eventstore");
    group.sample_size(10).measurement_time(Duration::from_secs(10));
    group.throughput(Throughput::Elements(BURST as u64));
    group.bench_function("record_and_flush_10k", |b| {
        b.iter_batched(
            || {
                next += BURST;
                (next - BURST..next).map(event).collect::<Vec<_>>()
            },
            |events| {
                for event in events {
                    store.record(event).expect("the queue holds a whole burst");
                }
                store.flush().unwrap();
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
    assert_eq!(store.stats().dropped, 0);
}

fn bench_query(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir);
    for chunk in (0..STORED).collect::<Vec<_>>().chunks(BURST) {
        for &n in chunk {
            store.record(event(n)).unwrap();
        }
        store.flush().unwrap();
    }
    let mut group = c.benchmark_group("eventstore");
    let by_stream = EventQuery {
        stream: Some("cam-1".into()),
        label: Some("person".into()),
        ..EventQuery::default()
    };
    group.bench_function("query_page_of_100_by_stream_and_label_in_100k", |b| {
        b.iter(|| store.query(&by_stream).unwrap())
    });
    let page = store.query(&by_stream).unwrap();
    let deeper = EventQuery {
        cursor: page.next,
        ..by_stream
    };
    group.bench_function("query_next_page_by_cursor_in_100k", |b| {
        b.iter(|| store.query(&deeper).unwrap())
    });
    group.finish();
}

criterion_group!(benches, bench_write, bench_query);
criterion_main!(benches);
