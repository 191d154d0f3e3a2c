//! What the latency window costs a request (`Engine::finish` takes its mutex and records
//! one latency) and the queue task's tick (`stats`, merging ten slices), next to what an
//! uncontended mutex alone costs, in one run so the ratios hold whatever the machine's load.

use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use peregrine_engine::window::LatencyWindow;

fn bench_window(c: &mut Criterion) {
    let t0 = Instant::now();
    let window = Mutex::new(LatencyWindow::new(Duration::from_secs(10), t0));
    let mut g = c.benchmark_group("latency_window");
    let mut n = 0u64;
    g.bench_function("record_one_answer", |b| {
        b.iter(|| {
            n += 1;
            // Latencies from 1 to 100 ms, spread over the window's slices.
            let latency = Duration::from_micros(1_000 + (n * 7_919) % 99_000);
            let now = t0 + Duration::from_micros(n * 50);
            window.lock().unwrap().answered(black_box(latency), now);
        })
    });
    let now = t0 + Duration::from_micros(n * 50);
    g.bench_function("stats_of_a_full_window", |b| {
        b.iter(|| black_box(window.lock().unwrap().stats(now)))
    });
    let bare = Mutex::new(0u64);
    g.bench_function("uncontended_mutex_alone", |b| {
        b.iter(|| *bare.lock().unwrap() += 1)
    });
    g.finish();
}

criterion_group!(benches, bench_window);
criterion_main!(benches);
