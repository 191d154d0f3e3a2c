//! Per-request detection settings, how a request's choices resolve over a model's
//! defaults, and their validation.

use crate::ClassNames;

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

/// One entry of a class filter as a caller wrote it: a class id, or one of the model's
/// class names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClassRef {
    Id(u32),
    Name(String),
}

impl ClassRef {
    /// `"2"` is the id 2; anything else is a name (surrounding spaces ignored).
    pub fn parse(text: &str) -> Self {
        let text = text.trim();
        text.parse()
            .map_or_else(|_| Self::Name(text.to_string()), Self::Id)
    }

    /// A comma-separated list such as `"person, 2,car"`; empty entries are skipped.
    pub fn parse_list(text: &str) -> Vec<Self> {
        text.split(',')
            .filter(|s| !s.trim().is_empty())
            .map(Self::parse)
            .collect()
    }

    /// The class id, looking names up in `names`.
    pub fn resolve(&self, names: &ClassNames) -> Result<u32, ParamsError> {
        match self {
            Self::Id(id) => Ok(*id),
            Self::Name(n) => names.id_of(n).ok_or_else(|| ParamsError::UnknownClass(n.clone())),
        }
    }
}

/// What one request asks for; every field left `None` takes the model's default.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParamsRequest {
    pub conf: Option<f32>,
    pub iou: Option<f32>,
    pub max_det: Option<usize>,
    /// The class filter; `Some(vec![])` keeps no class at all.
    pub classes: Option<Vec<ClassRef>>,
}

impl ParamsRequest {
    /// The request's settings over the model's `defaults`, class names resolved against
    /// the model's `names`, validated.
    pub fn resolve(&self, defaults: &DetectParams, names: &ClassNames) -> Result<DetectParams, ParamsError> {
        let classes = match &self.classes {
            None => defaults.classes.clone(),
            Some(list) => Some(
                list.iter()
                    .map(|c| c.resolve(names))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        let params = DetectParams {
            conf: self.conf.unwrap_or(defaults.conf),
            iou: self.iou.unwrap_or(defaults.iou),
            max_det: self.max_det.unwrap_or(defaults.max_det),
            classes,
        };
        params.validate()?;
        Ok(params)
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

    fn coco_like() -> ClassNames {
        ClassNames::new(vec!["person".into(), "bicycle".into(), "car".into()])
    }

    #[test]
    fn class_refs_parse_ids_then_names_and_skip_empty_entries() {
        assert_eq!(
            ClassRef::parse_list(" 0, car,,2 ,"),
            [ClassRef::Id(0), ClassRef::Name("car".into()), ClassRef::Id(2)]
        );
        assert_eq!(ClassRef::parse("-1"), ClassRef::Name("-1".into()));
        assert!(ClassRef::parse_list(" , ").is_empty());
    }

    #[test]
    fn a_request_overrides_only_what_it_sets() {
        let defaults = DetectParams {
            conf: 0.4,
            classes: Some(vec![1]),
            ..Default::default()
        };
        let names = coco_like();
        assert_eq!(
            ParamsRequest::default().resolve(&defaults, &names).unwrap(),
            defaults
        );
        let asked = ParamsRequest {
            iou: Some(0.5),
            max_det: Some(7),
            classes: Some(vec![ClassRef::Name("CAR".into()), ClassRef::Id(0)]),
            ..Default::default()
        };
        assert_eq!(
            asked.resolve(&defaults, &names).unwrap(),
            DetectParams {
                conf: 0.4,
                iou: 0.5,
                max_det: 7,
                classes: Some(vec![2, 0]),
            }
        );
        let nothing = ParamsRequest {
            classes: Some(vec![]),
            ..Default::default()
        };
        assert_eq!(nothing.resolve(&defaults, &names).unwrap().classes, Some(vec![]));
    }

    #[test]
    fn unknown_classes_and_out_of_range_values_are_refused() {
        let unknown = ParamsRequest {
            classes: Some(ClassRef::parse_list("person,giraffe")),
            ..Default::default()
        };
        assert_eq!(
            unknown.resolve(&DetectParams::default(), &coco_like()),
            Err(ParamsError::UnknownClass("giraffe".into()))
        );
        let high = ParamsRequest {
            conf: Some(2.0),
            ..Default::default()
        };
        let err = high.resolve(&DetectParams::default(), &coco_like()).unwrap_err();
        assert!(err.to_string().starts_with("conf is 2"), "{err}");
    }
}
