//! How detection results are written for people and programs.

use std::io::Write;

use peregrine_api::DetectionJson;
use serde::Serialize;

/// One line of `peregrine detect`'s JSON output.
#[derive(Debug, Serialize)]
pub struct ImageReport<'a> {
    pub image: &'a str,
    pub width: u32,
    pub height: u32,
    pub detections: Vec<DetectionJson>,
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
    use peregrine_types::{BBox, ClassNames, Detection};

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
            detections: vec![DetectionJson::new(&d, &names)],
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
