//! How detection results are written for people and programs.

use std::io::Write;

use peregrine_types::{ClassNames, Detection};
use serde::Serialize;

/// One line of `peregrine detect`'s JSON output.
#[derive(Debug, Serialize)]
pub struct ImageReport<'a> {
    pub image: &'a str,
    pub width: u32,
    pub height: u32,
    pub detections: Vec<DetectionReport>,
}

#[derive(Debug, Serialize)]
pub struct DetectionReport {
    pub class_id: u32,
    pub class_name: String,
    pub score: f64,
    #[serde(rename = "box")]
    pub bbox: [f64; 4],
}

/// Scores keep 5 decimals and coordinates 2: finer digits are noise from the model.
fn round(v: f32, decimals: i32) -> f64 {
    let k = 10f64.powi(decimals);
    (f64::from(v) * k).round() / k
}

impl DetectionReport {
    pub fn new(d: &Detection, names: &ClassNames) -> Self {
        Self {
            class_id: d.class_id,
            class_name: names.name(d.class_id).into_owned(),
            score: round(d.score, 5),
            bbox: [d.bbox.x1, d.bbox.y1, d.bbox.x2, d.bbox.y2].map(|v| round(v, 2)),
        }
    }
}

pub fn write_json(out: &mut impl Write, report: &ImageReport<'_>) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, report)?;
    writeln!(out)
}

pub fn write_table(out: &mut impl Write, report: &ImageReport<'_>) -> std::io::Result<()> {
    let n = report.detections.len();
    writeln!(
        out,
        "{} ({}x{}): {n} detection{}",
        report.image,
        report.width,
        report.height,
        if n == 1 { "" } else { "s" }
    )?;
    if n > 0 {
        writeln!(
            out,
            "  {:<16} {:>6} {:>8} {:>8} {:>8} {:>8}",
            "class", "score", "x1", "y1", "x2", "y2"
        )?;
    }
    for d in &report.detections {
        let [x1, y1, x2, y2] = d.bbox;
        writeln!(
            out,
            "  {:<16} {:>6.3} {x1:>8.1} {y1:>8.1} {x2:>8.1} {y2:>8.1}",
            d.class_name, d.score
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use peregrine_types::BBox;

    fn sample() -> ImageReport<'static> {
        let names = ClassNames::new(vec!["person".into()]);
        let d = Detection {
            class_id: 0,
            score: 0.912_345_6,
            bbox: BBox::new(1.234, 2.0, 30.999, 40.5),
        };
        ImageReport {
            image: "a.jpg",
            width: 64,
            height: 48,
            detections: vec![DetectionReport::new(&d, &names)],
        }
    }

    #[test]
    fn json_line_has_the_documented_shape() {
        let mut out = Vec::new();
        write_json(&mut out, &sample()).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "{\"image\":\"a.jpg\",\"width\":64,\"height\":48,\"detections\":[{\"class_id\":0,\
             \"class_name\":\"person\",\"score\":0.91235,\"box\":[1.23,2.0,31.0,40.5]}]}\n"
        );
    }

    #[test]
    fn table_lists_each_detection() {
        let mut out = Vec::new();
        write_table(&mut out, &sample()).unwrap();
        let s = String::from_utf8(out).unwrap();
        assert!(s.starts_with("a.jpg (64x48): 1 detection\n"), "{s}");
        assert!(s.contains("person"));
    }
}
