//! Gauge families in Prometheus' text format, for the gauges `/metrics` writes by hand
//! beside the `metrics` exporter's own (per-version objectives, GPU readings).

use std::fmt::Write as _;

/// Writes one gauge family: `# HELP` (when given) and `# TYPE` once, before its first
/// sample, then a line per sample; nothing at all when `samples` is empty, so a family
/// without readings is absent rather than typed and empty. Each sample is its label pairs,
/// written as given (values escaped by [`label_value`]), and its value.
pub fn write_family<L>(out: &mut String, name: &str, help: Option<&str>, samples: L)
where
    L: IntoIterator<Item = (String, f64)>,
{
    let mut typed = false;
    for (labels, value) in samples {
        if !typed {
            if let Some(help) = help {
                let _ = writeln!(out, "# HELP {name} {help}");
            }
            let _ = writeln!(out, "# TYPE {name} gauge");
            typed = true;
        }
        let _ = writeln!(out, "{name}{{{labels}}} {value}");
    }
}

/// A label value as the text format escapes it.
pub fn label_value(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_family_is_typed_once_and_absent_without_samples() {
        let mut out = String::new();
        write_family(&mut out, "g", Some("help."), Vec::new());
        assert_eq!(out, "");
        let samples = vec![("a=\"1\"".to_string(), 1.0), ("a=\"2\"".to_string(), 2.5)];
        write_family(&mut out, "g", Some("help."), samples);
        assert_eq!(
            out,
            "# HELP g help.\n# TYPE g gauge\ng{a=\"1\"} 1\ng{a=\"2\"} 2.5\n"
        );
    }

    #[test]
    fn label_values_escape_quotes_backslashes_and_newlines() {
        assert_eq!(label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
