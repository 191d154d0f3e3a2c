//! What a loaded model tells us about itself, independent of the runtime that loaded it.

use std::collections::BTreeMap;
use std::sync::Arc;

/// One dimension of a tensor as the model declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dim {
    Fixed(usize),
    /// Symbolic or unknown: the caller chooses it at run time.
    Dynamic,
}

impl Dim {
    pub fn fixed(self) -> Option<usize> {
        match self {
            Dim::Fixed(n) => Some(n),
            Dim::Dynamic => None,
        }
    }
}

/// Element types the pipeline cares about; everything else is carried by name for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ElementType {
    F32,
    F16,
    U8,
    Other(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorDescription {
    pub name: String,
    pub element: ElementType,
    pub dims: Vec<Dim>,
}

/// Metadata key with which a graph rewritten by `peregrine-onnx` says its output holds
/// top-K candidate rows (x1, y1, x2, y2, score, class; best first) that still need NMS.
pub const OUTPUT_FORM_KEY: &str = "peregrine_output";
/// [`OUTPUT_FORM_KEY`]'s value for candidate rows.
pub const CANDIDATES_FORM: &str = "candidates";

/// The model as a backend sees it: its tensors and the free-form metadata it carries
/// (Ultralytics exports put `names`, `imgsz`, `stride` and `end2end` there).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelDescription {
    pub inputs: Vec<TensorDescription>,
    pub outputs: Vec<TensorDescription>,
    pub metadata: BTreeMap<String, String>,
}

/// Class id to name. Ids beyond the table are named `class<id>` rather than failing, since
/// a model without names metadata is still useful.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClassNames(Arc<[String]>);

impl ClassNames {
    pub fn new(names: Vec<String>) -> Self {
        Self(names.into())
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn get(&self, id: u32) -> Option<&str> {
        self.0.get(id as usize).map(String::as_str)
    }

    /// The display name; unnamed ids get a stable placeholder.
    pub fn name(&self, id: u32) -> std::borrow::Cow<'_, str> {
        match self.get(id) {
            Some(n) => n.into(),
            None => format!("class{id}").into(),
        }
    }

    /// Looks a class up by name (exact, then case-insensitive).
    pub fn id_of(&self, name: &str) -> Option<u32> {
        let pos = self
            .0
            .iter()
            .position(|n| n == name)
            .or_else(|| self.0.iter().position(|n| n.eq_ignore_ascii_case(name)))?;
        u32::try_from(pos).ok()
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }
    /// Class names as Ultralytics writes them in a model's `names` metadata: a Python dict
    /// literal such as `{0: 'person', 1: "o'clock"}` (ids 0..n in order), or a list
    /// `['person', 'bicycle']`. `None` when the value does not parse or names nothing; the
    /// detector and the graph rewrite both read names through this, so they always agree
    /// on the class count.
    pub fn from_ultralytics(s: &str) -> Option<Self> {
        let s = s.trim();
        let (is_dict, body) = if let Some(b) = s.strip_prefix('{').and_then(|b| b.strip_suffix('}')) {
            (true, b)
        } else {
            (false, s.strip_prefix('[')?.strip_suffix(']')?)
        };
        let mut chars = body.chars().peekable();
        let mut names = Vec::new();
        loop {
            while chars.peek().is_some_and(|c| c.is_whitespace() || *c == ',') {
                chars.next();
            }
            if chars.peek().is_none() {
                break;
            }
            if is_dict {
                let mut key = String::new();
                while let Some(c) = chars.next_if(|c| *c != ':') {
                    key.push(c);
                }
                chars.next()?; // ':'
                if key.trim().parse::<usize>().ok()? != names.len() {
                    return None;
                }
                while chars.next_if(|c| c.is_whitespace()).is_some() {}
            }
            let quote = chars.next().filter(|c| *c == '\'' || *c == '"')?;
            let mut name = String::new();
            loop {
                match chars.next()? {
                    '\\' => name.push(chars.next()?),
                    c if c == quote => break,
                    c => name.push(c),
                }
            }
            names.push(name);
        }
        (!names.is_empty()).then(|| Self::new(names))
    }
}

/// The model a request means when it may name none: the one it names, else the only
/// model served. With several served and none named, the caller must ask for a name.
pub fn named_or_only<'a>(
    named: Option<&'a str>,
    served: impl IntoIterator<Item = &'a str>,
) -> Result<&'a str, NoModelNamed> {
    if let Some(name) = named {
        return Ok(name);
    }
    let served: Vec<&str> = served.into_iter().collect();
    match served.as_slice() {
        [only] => Ok(only),
        _ => Err(NoModelNamed {
            served: served.into_iter().map(str::to_string).collect(),
        }),
    }
}

/// No model was named and there is not exactly one to fall back on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", match .served.as_slice() {
    [] => "this server has no model".to_string(),
    names => format!("this server has: {}", names.join(", ")),
})]
pub struct NoModelNamed {
    pub served: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ultralytics_names() {
        let n = ClassNames::from_ultralytics("{0: 'person', 1: \"o'clock\", 2: 'a\\'b'}").unwrap();
        assert_eq!(n.iter().collect::<Vec<_>>(), ["person", "o'clock", "a'b"]);
        let n = ClassNames::from_ultralytics("['cat', 'dog']").unwrap();
        assert_eq!(n.len(), 2);
        assert!(ClassNames::from_ultralytics("{1: 'skips zero'}").is_none());
        assert!(ClassNames::from_ultralytics("{0: 'unterminated}").is_none());
        assert!(ClassNames::from_ultralytics("{0: 'person'").is_none());
        assert!(ClassNames::from_ultralytics("{}").is_none());
        assert!(ClassNames::from_ultralytics("garbage").is_none());
    }

    #[test]
    fn the_named_model_wins_else_the_only_one() {
        assert_eq!(named_or_only(Some("b"), ["a", "c"]), Ok("b"));
        assert_eq!(named_or_only(None, ["a"]), Ok("a"));
        let two = named_or_only(None, ["a", "b"]).unwrap_err();
        assert_eq!(two.to_string(), "this server has: a, b");
        let none = named_or_only(None, []).unwrap_err();
        assert_eq!(none.to_string(), "this server has no model");
    }
}
