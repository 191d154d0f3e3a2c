//! The Ultralytics metadata the rewrite relies on: how many class names, which task, and
//! whether the head is end-to-end.

use peregrine_types::ClassNames;

use crate::proto::StringStringEntryProto;

/// What the exporter wrote in `metadata_props` that decides which rewrite fits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ModelMetadata {
    /// Number of entries in `names`, when it is present and parses.
    pub num_names: Option<usize>,
    /// `task` (`detect`, `segment`, `pose`, ...), when present.
    pub task: Option<String>,
    /// `end2end`, when present.
    pub end2end: Option<bool>,
}

impl ModelMetadata {
    pub fn read(props: &[StringStringEntryProto]) -> Self {
        let get = |key: &str| {
            props
                .iter()
                .find(|p| p.key.as_deref() == Some(key))
                .and_then(|p| p.value.as_deref())
        };
        Self {
            num_names: get("names").and_then(count_names),
            task: get("task").map(|t| t.trim().to_string()),
            end2end: get("end2end").map(|v| v.trim().eq_ignore_ascii_case("true")),
        }
    }
}

/// How many class names `names` holds, read as the detector reads it.
fn count_names(s: &str) -> Option<usize> {
    ClassNames::from_ultralytics(s).map(|names| names.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(k: &str, v: &str) -> StringStringEntryProto {
        StringStringEntryProto {
            key: Some(k.into()),
            value: Some(v.into()),
        }
    }

    #[test]
    fn counts_dict_and_list_names() {
        assert_eq!(count_names("{0: 'person', 1: \"o'clock\", 2: 'a\\'b'}"), Some(3));
        assert_eq!(count_names("['person', 'bicycle']"), Some(2));
    }

    #[test]
    fn malformed_names_count_as_absent() {
        assert_eq!(count_names("{1: 'person'}"), None, "ids must start at 0");
        assert_eq!(count_names("{0: 'person'"), None);
        assert_eq!(count_names("{}"), None);
        assert_eq!(count_names("person"), None);
    }

    #[test]
    fn reads_task_and_end2end() {
        let m = ModelMetadata::read(&[
            entry("names", "{0: 'a', 1: 'b'}"),
            entry("task", "detect"),
            entry("end2end", "False"),
        ]);
        assert_eq!(m.num_names, Some(2));
        assert_eq!(m.task.as_deref(), Some("detect"));
        assert_eq!(m.end2end, Some(false));
        assert_eq!(ModelMetadata::read(&[]), ModelMetadata::default());
    }
}
