//! What a stream's analytics show outside: the occupancy report (`GET
//! /v1/streams/{name}/zones`) and the Prometheus series (zone occupancy gauges, line and
//! object-event counters; names in [`crate::telemetry`]).

use std::collections::BTreeMap;

use peregrine_types::ClassNames;
use peregrine_zones::Analytics;

use super::stream::StreamAnalytics;
use crate::event::{ObjectEvent, ObjectEventKind};
use crate::telemetry;

/// A stream's analytics now.
#[derive(Debug, Clone, PartialEq)]
pub struct AnalyticsReport {
    pub tracking: bool,
    /// Tracks the tracker holds (confirmed or not, seen or briefly lost).
    pub live_tracks: usize,
    pub zones: Vec<ZoneReport>,
    pub lines: Vec<LineReport>,
    /// Why the analytics settings do not apply (a class the model does not have, pixel
    /// coordinates outside the stream's frames), if so.
    pub zone_error: Option<String>,
}

/// Who is inside one zone.
#[derive(Debug, Clone, PartialEq)]
pub struct ZoneReport {
    pub name: String,
    pub objects: usize,
    /// `(label, count)`, classes with none left out.
    pub by_class: Vec<(String, usize)>,
    pub track_ids: Vec<u64>,
}

/// One line's crossings since the stream started (or the lines were last set).
#[derive(Debug, Clone, PartialEq)]
pub struct LineReport {
    pub name: String,
    pub total_in: u64,
    pub total_out: u64,
    /// `(label, in, out)`.
    pub by_class: Vec<(String, u64, u64)>,
}

pub(crate) fn report(analytics: &StreamAnalytics) -> AnalyticsReport {
    let names = analytics.names();
    let (zones, lines) = match analytics.zones() {
        Some(z) => (zone_reports(z, names), line_reports(z, names)),
        None => (Vec::new(), Vec::new()),
    };
    AnalyticsReport {
        tracking: analytics.tracking(),
        live_tracks: analytics.live_tracks(),
        zones,
        lines,
        zone_error: analytics.error().map(str::to_string),
    }
}

fn zone_reports(zones: &Analytics, names: &ClassNames) -> Vec<ZoneReport> {
    zones
        .occupancy()
        .into_iter()
        .map(|o| ZoneReport {
            objects: o.tracks.len(),
            by_class: o
                .by_class
                .iter()
                .map(|(c, n)| (names.name(*c).into_owned(), *n))
                .collect(),
            track_ids: o.tracks,
            name: o.name,
        })
        .collect()
}

fn line_reports(zones: &Analytics, names: &ClassNames) -> Vec<LineReport> {
    zones
        .line_counts()
        .into_iter()
        .map(|l| {
            let mut classes: Vec<u32> = l
                .in_by_class
                .keys()
                .chain(l.out_by_class.keys())
                .copied()
                .collect();
            classes.sort_unstable();
            classes.dedup();
            let count = |m: &BTreeMap<u32, u64>, c: u32| m.get(&c).copied().unwrap_or(0);
            LineReport {
                total_in: l.in_by_class.values().sum(),
                total_out: l.out_by_class.values().sum(),
                by_class: classes
                    .iter()
                    .map(|&c| {
                        (
                            names.name(c).into_owned(),
                            count(&l.in_by_class, c),
                            count(&l.out_by_class, c),
                        )
                    })
                    .collect(),
                name: l.name,
            }
        })
        .collect()
}

/// The zone occupancy gauges a stream has set, so a class that leaves a zone goes back
/// to 0 rather than keeping its last count.
#[derive(Default)]
pub(crate) struct ZoneGauges {
    set: BTreeMap<(String, u32), usize>,
}

impl ZoneGauges {
    /// Sets each zone's gauges after a frame (only those that changed).
    pub fn update(&mut self, stream: &str, zones: &Analytics, names: &ClassNames) {
        let mut now = BTreeMap::new();
        for o in zones.occupancy() {
            for (class, n) in o.by_class {
                now.insert((o.name.clone(), class), n);
            }
        }
        for (key, _) in self.set.iter().filter(|(k, _)| !now.contains_key(*k)) {
            telemetry::zone_objects(stream, &key.0, &names.name(key.1), 0);
        }
        for (key, n) in now.iter().filter(|(k, n)| self.set.get(*k) != Some(*n)) {
            telemetry::zone_objects(stream, &key.0, &names.name(key.1), *n);
        }
        self.set = now;
    }
}

/// Counts an object event (and a line crossing by direction and class).
pub(crate) fn object_event(event: &ObjectEvent) {
    telemetry::object_event(&event.stream, event.kind.name());
    if let ObjectEventKind::LineCross { line, direction } = &event.kind {
        telemetry::line_crossed(&event.stream, line, direction.as_str(), &event.label);
    }
}
