//! An error and its causes on one line, for people.

use std::fmt::Write;

/// `error: cause: cause's cause ...`, like anyhow's `{:#}`, leaving out a cause whose text
/// the message so far already ends with: the library errors quote their source in their
/// own message (`"...: {0}"`, so that a log line of the outer error alone says what went
/// wrong) and also expose it as `source()`, which `{:#}` printed twice.
pub fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if line.is_empty() {
            line = text;
        } else if !line.ends_with(&text) {
            let _ = write!(line, ": {text}");
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use std::error::Error;
    use std::fmt;

    use super::*;

    /// An error with a message and an optional source, as thiserror makes them.
    #[derive(Debug)]
    struct Layer {
        message: String,
        source: Option<Box<dyn Error + Send + Sync>>,
    }

    impl fmt::Display for Layer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(&self.message)
        }
    }

    impl Error for Layer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.source.as_deref().map(|e| e as &(dyn Error + 'static))
        }
    }

    fn layer(message: &str, source: Option<Layer>) -> Layer {
        Layer {
            message: message.into(),
            source: source.map(|s| Box::new(s) as Box<dyn Error + Send + Sync>),
        }
    }

    #[test]
    fn a_cause_the_message_quotes_is_said_once() {
        let fixed = layer("the input is fixed at 640x640", None);
        let spec = layer("not a detector: the input is fixed at 640x640", Some(fixed));
        let e = anyhow::Error::new(spec).context("loading model m.onnx");
        assert_eq!(
            one_line(&e),
            "loading model m.onnx: not a detector: the input is fixed at 640x640"
        );
    }

    #[test]
    fn a_cause_the_message_does_not_quote_is_added() {
        let io = layer("no such file", None);
        let e =
            anyhow::Error::new(layer("could not read the file", Some(io))).context("loading model m.onnx");
        assert_eq!(
            one_line(&e),
            "loading model m.onnx: could not read the file: no such file"
        );
    }
}
