//! Tracks a stream of per-frame detections: reads JSON lines on stdin (one frame per line, as
//! `peregrine detect --format json` writes them: `{"detections": [{"class_id", "score",
//! "box": [x1, y1, x2, y2]}, ...], ...}`) and writes the same lines with a `track_id` on each
//! detection (`null` when untracked).
//!
//! A frame's media time is its `pts_seconds` field (as the server's detection events carry it)
//! when present, else its line number divided by `--fps` (default 30). `--class-agnostic` matches across classes, as `trackers`
//! does; `--lost-after-s S`, `--high-score`, `--new-track-score`, `--match-iou` and `--min-hits`
//! set the other settings. Used by scripts/track-compare.py.

use std::io::{BufRead, BufWriter, Write};
use std::time::Duration;

use peregrine_track::{Tracker, TrackerConfig};
use peregrine_types::{BBox, Detection};
use serde_json::Value;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = TrackerConfig::default();
    let mut fps = 30.0f64;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--class-agnostic" => config.class_aware = false,
            "--fps" => fps = value(&mut args, "--fps")?,
            "--high-score" => config.high_score = value(&mut args, "--high-score")?,
            "--new-track-score" => config.new_track_score = value(&mut args, "--new-track-score")?,
            "--match-iou" => config.match_iou = value(&mut args, "--match-iou")?,
            "--min-hits" => config.min_hits = value(&mut args, "--min-hits")?,
            "--lost-after-s" => {
                config.lost_after = Duration::from_secs_f64(value(&mut args, "--lost-after-s")?)
            }
            other => {
                return Err(format!("unknown argument {other:?} (see the example's doc comment)").into())
            }
        }
    }
    config.validate()?;
    let mut tracker = Tracker::new(config);
    let mut out = BufWriter::new(std::io::stdout().lock());
    for (index, line) in std::io::stdin().lock().lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let mut frame: Value = serde_json::from_str(&line).map_err(|e| format!("line {}: {e}", index + 1))?;
        let at = match frame.get("pts_seconds").and_then(Value::as_f64) {
            Some(seconds) => Duration::from_secs_f64(seconds),
            None => Duration::from_secs_f64(index as f64 / fps),
        };
        let detections = frame
            .get("detections")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("line {}: no detections array", index + 1))?
            .iter()
            .map(parse_detection)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("line {}: {e}", index + 1))?;
        let update = tracker.observe(&detections, at);
        if let Some(list) = frame.get_mut("detections").and_then(Value::as_array_mut) {
            for (det, id) in list.iter_mut().zip(update.assignments) {
                det["track_id"] = id.map_or(Value::Null, |id| id.0.into());
            }
        }
        serde_json::to_writer(&mut out, &frame)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

fn value<T: std::str::FromStr>(args: &mut impl Iterator<Item = String>, flag: &str) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    let text = args.next().ok_or(format!("{flag} needs a value"))?;
    text.parse().map_err(|e| format!("{flag} {text:?}: {e}"))
}

fn parse_detection(value: &Value) -> Result<Detection, String> {
    let number = |v: Option<&Value>, what: &str| {
        v.and_then(Value::as_f64)
            .ok_or(format!("detection without a numeric {what}"))
    };
    let coords = value
        .get("box")
        .and_then(Value::as_array)
        .filter(|b| b.len() == 4)
        .ok_or("detection without a 4-number box")?;
    let c: Vec<f32> = coords
        .iter()
        .map(|v| number(Some(v), "box").map(|x| x as f32))
        .collect::<Result<_, _>>()?;
    Ok(Detection {
        class_id: number(value.get("class_id"), "class_id")? as u32,
        score: number(value.get("score"), "score")? as f32,
        bbox: BBox::new(c[0], c[1], c[2], c[3]),
    })
}
