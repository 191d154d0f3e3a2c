//! TensorRT's calibration cache: the text `--trt-int8-calibration-table` (ONNX Runtime's
//! TensorRT provider, `trt_int8_calibration_table_name`) and `trtexec --calib` read.
//!
//! The first line names the TensorRT version and calibrator (`TRT-<version>-
//! EntropyCalibration2`); each further line is `<tensor>: <scale>`, the scale being the
//! symmetric int8 step (`amax / 127`) written as the hex of its big-endian float32 bits.

use std::fmt::Write;

/// The cache's text for `ranges` (tensor, `(low, high)`), in the order given.
pub fn calibration_table(trt_version: &str, ranges: &[(String, (f32, f32))]) -> String {
    let mut out = format!("TRT-{trt_version}-EntropyCalibration2\n");
    for (name, (low, high)) in ranges {
        let amax = low.abs().max(high.abs());
        let _ = writeln!(out, "{name}: {:08x}", scale_of(amax).to_bits());
    }
    out
}

/// The int8 step covering `[-amax, amax]`; a tensor that was always 0 gets a tiny step so
/// TensorRT never divides by zero.
fn scale_of(amax: f32) -> f32 {
    if amax > 0.0 && amax.is_finite() {
        amax / 127.0
    } else {
        1e-8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_trt_cache_lines() {
        let table = calibration_table(
            "100900",
            &[
                ("images".into(), (0.0, 1.0)),
                ("/model.0/conv/Conv_output_0".into(), (-3.0, 12.7)),
            ],
        );
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[0], "TRT-100900-EntropyCalibration2");
        // 1/127 = 0.007874016 = 0x3c010204 in IEEE-754.
        assert_eq!(lines[1], "images: 3c010204");
        // 12.7/127 = 0.1 = 0x3dcccccd.
        assert_eq!(lines[2], "/model.0/conv/Conv_output_0: 3dcccccd");
        assert_eq!(lines.len(), 3);
        assert!(table.ends_with('\n'));
        for line in &lines[1..] {
            let hex = line.rsplit(": ").next().unwrap_or_default();
            assert_eq!(hex.len(), 8);
            assert!(u32::from_str_radix(hex, 16).is_ok());
        }
    }
}
