//! The one YAML reader of configuration files: a document into a generic value, and a
//! mistake as a line, a column and a message that never quotes the source (a file can
//! hold a token or a database password next to the mistake).

use serde::de::DeserializeOwned;

/// Why a YAML document could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct YamlError {
    /// What is wrong, with its line and column when known, without any of the source.
    pub message: String,
    /// 1-based line of the mistake, when known.
    pub line: Option<usize>,
    /// 1-based column of the mistake, when known.
    pub column: Option<usize>,
}

impl YamlError {
    /// ` at line L column C`, or nothing when the position is unknown.
    pub fn at(&self) -> String {
        match (self.line, self.column) {
            (Some(l), Some(c)) => format!(" at line {l} column {c}"),
            (Some(l), None) => format!(" at line {l}"),
            _ => String::new(),
        }
    }
}

/// Parse `text` as one YAML document into `T` (a generic `serde_json::Value` for
/// configuration files, so that each section can be checked on its own).
pub fn parse_yaml<T: DeserializeOwned>(text: &str) -> Result<T, YamlError> {
    serde_saphyr::from_str(text).map_err(|e| {
        let location = e.location();
        YamlError {
            message: e.without_snippet().to_string(),
            line: location.as_ref().map(|l| l.line() as usize),
            column: location.as_ref().map(|l| l.column() as usize),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mistake_names_its_place_and_never_quotes_the_source() {
        let e = parse_yaml::<serde_json::Value>("token: s3cr3t: x\n").expect_err("bad");
        assert_eq!((e.line, e.column), (Some(1), Some(14)), "{e:?}");
        assert!(!e.message.contains("s3cr3t"), "{}", e.message);
        assert_eq!(e.at(), " at line 1 column 14");
    }

    #[test]
    fn documents_read_as_json_values() {
        let v: serde_json::Value =
            parse_yaml("a: 1\nb: [x, {c: 2.5}]\nn: ~\nt: true\n").expect("parses");
        assert_eq!(
            v,
            serde_json::json!({"a": 1, "b": ["x", {"c": 2.5}], "n": null, "t": true})
        );
        let e = parse_yaml::<serde_json::Value>("a: 1\na: 2\n").expect_err("duplicate");
        assert!(e.message.contains("duplicate"), "{}", e.message);
    }
}
