//! The one output grammar of every command: `-o/--output table|wide|json|yaml`, and the
//! documents (`json`, `yaml`) printed the same way everywhere.

use serde::Serialize;
use warden_config::outln;

/// How answers are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Output {
    /// Aligned columns and readable views, cut to the terminal's width.
    #[default]
    Table,
    /// As `table`, never cut to the terminal's width.
    Wide,
    /// The whole answer as JSON, pretty-printed.
    Json,
    /// The whole answer as YAML.
    Yaml,
}

impl Output {
    /// Whether the answer is printed as a document (JSON or YAML), not for reading.
    pub fn is_document(self) -> bool {
        matches!(self, Output::Json | Output::Yaml)
    }

    /// The width tables are cut to: the terminal's for `table`, none for the others.
    pub fn width(self) -> Option<usize> {
        match self {
            Output::Table => crate::show::terminal_width(),
            Output::Wide | Output::Json | Output::Yaml => None,
        }
    }
}

/// Why a document could not be printed.
#[derive(Debug, thiserror::Error)]
#[error("cannot encode the answer as {format}: {detail}")]
pub struct EncodeError {
    /// `JSON` or `YAML`.
    pub format: &'static str,
    /// The encoder's words.
    pub detail: String,
}

/// `value` as the document `out` asks for (JSON for `table` and `wide`), ending in a
/// newline.
pub fn document<T: Serialize>(out: Output, value: &T) -> Result<String, EncodeError> {
    match out {
        Output::Yaml => serde_saphyr::to_string(value).map_err(|e| EncodeError {
            format: "YAML",
            detail: e.to_string(),
        }),
        Output::Table | Output::Wide | Output::Json => serde_json::to_string_pretty(value)
            .map(|mut s| {
                s.push('\n');
                s
            })
            .map_err(|e| EncodeError {
                format: "JSON",
                detail: e.to_string(),
            }),
    }
}

/// Print `value` as the document `out` asks for (a closed stdout ends the process
/// quietly, `warden_config::stdout`).
pub fn print_document<T: Serialize>(out: Output, value: &T) -> Result<(), EncodeError> {
    let text = document(out, value)?;
    outln!("{}", text.trim_end_matches('\n'));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_are_json_or_yaml_and_end_in_one_newline() {
        let v = serde_json::json!({"id": "inc-1", "ranks": [3, 5], "confidence": 0.9});
        let json = document(Output::Json, &v).expect("json");
        assert!(json.ends_with("}\n") && !json.ends_with("\n\n"), "{json}");
        let back: serde_json::Value = serde_json::from_str(&json).expect("parses");
        assert_eq!(back, v);
        let yaml = document(Output::Yaml, &v).expect("yaml");
        assert!(yaml.contains("id: inc-1"), "{yaml}");
        let back: serde_json::Value = warden_model::yaml::from_str(&yaml).expect("parses");
        assert_eq!(back, v);
    }

    #[test]
    fn only_table_is_cut_to_the_terminal() {
        assert_eq!(Output::Wide.width(), None);
        assert_eq!(Output::Json.width(), None);
        assert!(Output::Json.is_document() && Output::Yaml.is_document());
        assert!(!Output::Table.is_document() && !Output::Wide.is_document());
    }
}
