//! Runs [`Analytics`] over JSON lines of tracked boxes, for `scripts/zones-compare.py`.
//!
//! Usage: `zones_jsonl <definition.json> <tracks.jsonl>`. Each input line is
//! `{"frame": n, "pts_ms": t, "objects": [{"track_id", "class_id", "bbox": [x1, y1, x2, y2]}]}`;
//! each output line is `{"frame", "zones": {name: [tracks inside and seen this frame]},
//! "crossings": [[track, line, "in"|"out"]]}`, and a last line `{"counts": {line: {"in":
//! {class: n}, "out": {..}}}}`. The definition is
//! `{"frame": [w, h], "anchor": "bottom_center", "hysteresis": {"frames", "margin_px"},
//! "zones": [{"name", "points": [[x, y]..], "units", "classes", "loiter_s"}],
//! "lines": [{"name", "start": [x, y], "end": [x, y], "units", "classes"}]}`.

use std::collections::{BTreeMap, HashSet};
use std::error::Error;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::time::Duration;

use peregrine_types::BBox;
use peregrine_zones::{
    Analytics, AnalyticsConfig, Hysteresis, LineSpec, Point, TrackedBox, Units, ZoneEventKind, ZoneSpec,
};
use serde_json::{json, Value};

type Result<T> = std::result::Result<T, Box<dyn Error>>;

fn point(value: &Value) -> Result<Point> {
    let xy = value.as_array().ok_or("a point is [x, y]")?;
    let coord = |i: usize| xy.get(i).and_then(Value::as_f64).ok_or("a point is [x, y]");
    Ok(Point::new(coord(0)? as f32, coord(1)? as f32))
}

fn units(value: &Value) -> Result<Units> {
    match value["units"].as_str().unwrap_or("pixels") {
        "pixels" => Ok(Units::Pixels),
        "normalized" => Ok(Units::Normalized),
        other => Err(format!("unknown units `{other}`").into()),
    }
}

fn classes(value: &Value) -> Option<Vec<u32>> {
    let list = value["classes"].as_array()?;
    Some(list.iter().filter_map(|c| c.as_u64()).map(|c| c as u32).collect())
}

fn zone(value: &Value) -> Result<ZoneSpec> {
    let points = value["points"].as_array().ok_or("a zone has points")?;
    Ok(ZoneSpec {
        name: value["name"].as_str().unwrap_or_default().to_owned(),
        points: points.iter().map(point).collect::<Result<_>>()?,
        units: units(value)?,
        classes: classes(value),
        loiter: value["loiter_s"].as_f64().map(Duration::from_secs_f64),
    })
}

fn line(value: &Value) -> Result<LineSpec> {
    Ok(LineSpec {
        name: value["name"].as_str().unwrap_or_default().to_owned(),
        start: point(&value["start"])?,
        end: point(&value["end"])?,
        units: units(value)?,
        classes: classes(value),
    })
}

fn analytics(definition: &Value) -> Result<Analytics> {
    let frame = &definition["frame"];
    let size = |i: usize| frame[i].as_u64().ok_or("frame is [width, height]");
    let hysteresis = &definition["hysteresis"];
    let hysteresis = Hysteresis {
        frames: hysteresis["frames"].as_u64().unwrap_or(1) as u32,
        margin_px: hysteresis["margin_px"].as_f64().unwrap_or(0.0) as f32,
    };
    let config = AnalyticsConfig {
        anchor: definition["anchor"].as_str().unwrap_or("bottom_center").parse()?,
        zone_hysteresis: hysteresis,
        line_hysteresis: hysteresis,
    };
    let list = |key: &str| definition[key].as_array().cloned().unwrap_or_default();
    let zones = list("zones").iter().map(zone).collect::<Result<_>>()?;
    let lines = list("lines").iter().map(line).collect::<Result<_>>()?;
    Ok(Analytics::new(
        zones,
        lines,
        config,
        (size(0)? as u32, size(1)? as u32),
    )?)
}

fn tracked(object: &Value) -> Result<TrackedBox> {
    let bbox = object["bbox"].as_array().ok_or("an object has a bbox")?;
    let coord = |i: usize| bbox.get(i).and_then(Value::as_f64).ok_or("bbox is 4 numbers");
    Ok(TrackedBox {
        track: object["track_id"].as_u64().ok_or("track_id")?,
        class_id: object["class_id"].as_u64().ok_or("class_id")? as u32,
        bbox: BBox::new(
            coord(0)? as f32,
            coord(1)? as f32,
            coord(2)? as f32,
            coord(3)? as f32,
        ),
    })
}

fn main() {
    if let Err(err) = run() {
        eprintln!("zones_jsonl: {err}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, definition, tracks] = args.as_slice() else {
        return Err("usage: zones_jsonl <definition.json> <tracks.jsonl>".into());
    };
    let mut analytics = analytics(&serde_json::from_str(&std::fs::read_to_string(definition)?)?)?;
    let mut out = BufWriter::new(std::io::stdout().lock());
    for input in BufReader::new(std::fs::File::open(tracks)?).lines() {
        let frame: Value = serde_json::from_str(&input?)?;
        let objects = frame["objects"].as_array().cloned().unwrap_or_default();
        let objects = objects.iter().map(tracked).collect::<Result<Vec<_>>>()?;
        let at = Duration::from_secs_f64(frame["pts_ms"].as_f64().unwrap_or(0.0) / 1000.0);
        let events = analytics.observe(&objects, at);
        let present: HashSet<u64> = objects.iter().map(|o| o.track).collect();
        let zones: BTreeMap<_, _> = analytics
            .occupancy()
            .into_iter()
            .map(|z| {
                let seen: Vec<u64> = z.tracks.into_iter().filter(|t| present.contains(t)).collect();
                (z.name, seen)
            })
            .collect();
        let crossings: Vec<Value> = events
            .iter()
            .filter_map(|e| match e.kind {
                ZoneEventKind::Cross(direction) => Some(json!([e.track, e.name, direction.name()])),
                _ => None,
            })
            .collect();
        writeln!(
            out,
            "{}",
            json!({"frame": frame["frame"], "zones": zones, "crossings": crossings})
        )?;
    }
    let counts: BTreeMap<_, _> = analytics
        .line_counts()
        .into_iter()
        .map(|c| (c.name, json!({"in": c.in_by_class, "out": c.out_by_class})))
        .collect();
    writeln!(out, "{}", json!({ "counts": counts }))?;
    Ok(())
}
