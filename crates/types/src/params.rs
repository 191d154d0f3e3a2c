//! Per-request detection settings and their validation.

/// Thresholds and filters applied after the model runs.
#[derive(Debug, Clone, PartialEq)]
pub struct DetectParams {
    /// Minimum score for a detection to be kept, in `[0, 1]`.
    pub conf: f32,
    /// IoU above which the lower-scored of two same-class boxes is suppressed, in `[0, 1]`.
    pub iou: f32,
    /// Most detections returned per image.
    pub max_det: usize,
    /// Keep only these class ids; `None` keeps all.
    pub classes: Option<Vec<u32>>,
}

impl DetectParams {
    pub const DEFAULT_CONF: f32 = 0.25;
    pub const DEFAULT_IOU: f32 = 0.7;
    pub const DEFAULT_MAX_DET: usize = 300;
    /// Upper bound on `max_det`, so a request cannot ask for unbounded output.
    pub const MAX_MAX_DET: usize = 10_000;

    /// Checks ranges; the message names the field and the allowed range.
    pub fn validate(&self) -> Result<(), ParamsError> {
        if !(0.0..=1.0).contains(&self.conf) || self.conf.is_nan() {
            return Err(ParamsError::OutOfRange {
                field: "conf",
                value: self.conf.to_string(),
                allowed: "0 to 1",
            });
        }
        if !(0.0..=1.0).contains(&self.iou) || self.iou.is_nan() {
            return Err(ParamsError::OutOfRange {
                field: "iou",
                value: self.iou.to_string(),
                allowed: "0 to 1",
            });
        }
        if self.max_det == 0 || self.max_det > Self::MAX_MAX_DET {
            return Err(ParamsError::OutOfRange {
                field: "max_det",
                value: self.max_det.to_string(),
                allowed: "1 to 10000",
            });
        }
        Ok(())
    }

    /// Whether `class_id` passes the class filter.
    pub fn wants_class(&self, class_id: u32) -> bool {
        self.classes
            .as_ref()
            .is_none_or(|allowed| allowed.contains(&class_id))
    }
}

impl Default for DetectParams {
    fn default() -> Self {
        Self {
            conf: Self::DEFAULT_CONF,
            iou: Self::DEFAULT_IOU,
            max_det: Self::DEFAULT_MAX_DET,
            classes: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParamsError {
    #[error("{field} is {value}, outside the allowed range {allowed}")]
    OutOfRange {
        field: &'static str,
        value: String,
        allowed: &'static str,
    },
    #[error("unknown class {0:?}: give a class id or one of the model's class names")]
    UnknownClass(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        DetectParams::default().validate().unwrap();
    }

    #[test]
    fn out_of_range_values_name_the_field() {
        let p = DetectParams {
            conf: 1.5,
            ..Default::default()
        };
        let msg = p.validate().unwrap_err().to_string();
        assert!(msg.contains("conf"), "{msg}");
        let p = DetectParams {
            iou: f32::NAN,
            ..Default::default()
        };
        assert!(p.validate().unwrap_err().to_string().contains("iou"));
        let p = DetectParams {
            max_det: 0,
            ..Default::default()
        };
        assert!(p.validate().unwrap_err().to_string().contains("max_det"));
    }

    #[test]
    fn class_filter() {
        let p = DetectParams {
            classes: Some(vec![0, 2]),
            ..Default::default()
        };
        assert!(p.wants_class(2));
        assert!(!p.wants_class(1));
        assert!(DetectParams::default().wants_class(77));
    }
}
