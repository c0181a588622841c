//! Reading YAML: one parser (serde-saphyr) with one set of options for every file Warden
//! reads, and errors that name the field and the position.
//!
//! The options keep the meaning the files have always had: only `true`/`false` are
//! booleans (`yes`, `on`, `no` stay strings and are refused where a boolean is due),
//! `0755` and `1_000` read into an untyped value stay strings, an `.inf` there becomes
//! null, duplicate keys are an error, and tags other than YAML's own are refused. Where
//! text is due, a plain number or boolean reads as its text (`12`, `true`); a null (`~`,
//! `null`, nothing) is refused.

use std::cell::RefCell;
use std::fmt;

use serde::de::DeserializeOwned;

/// The parser options every YAML file is read with.
pub fn options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
        non_finite_float_policy: serde_saphyr::NonFiniteFloatPolicy::PassThrough,
        reject_unsupported_tags: true,
        with_snippet: false,
    }
}

/// A YAML document that is not what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// The field where it went wrong (`sources[0].format`); empty for the document itself
    /// or where no field is known (bad syntax).
    pub path: String,
    /// What is wrong, ending with its position when known (`... at line 3, column 8`).
    pub message: String,
    /// Line, from 1, when known.
    pub line: Option<usize>,
    /// Column, from 1, when known.
    pub column: Option<usize>,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

impl std::error::Error for Error {}

impl Error {
    fn new(path: String, e: &serde_saphyr::Error) -> Error {
        let path = if path == "." || path == "?" {
            String::new()
        } else {
            path
        };
        let message = e.render_with_options(serde_saphyr::render_options! {
            formatter: &serde_saphyr::UserMessageFormatter,
            snippets: serde_saphyr::SnippetMode::Off,
        });
        let loc = e.location();
        Error {
            path,
            message,
            line: loc.and_then(|l| usize::try_from(l.line()).ok()),
            column: loc.and_then(|l| usize::try_from(l.column()).ok()),
        }
    }
}

/// Read one YAML document into `T`. An empty document reads as null (`None` for an
/// `Option`); more than one document is an error.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, Error> {
    let path = RefCell::new(String::new());
    serde_saphyr::with_deserializer_from_str_with_options(text, options(), |de| {
        serde_path_to_error::deserialize(de).map_err(|e| {
            *path.borrow_mut() = e.path().to_string();
            e.into_inner()
        })
    })
    .map_err(|e| Error::new(path.take(), &e))
}

/// Read a stream of YAML documents (`---` between them) into one `T` each; empty
/// documents are skipped.
pub fn from_str_multiple<T: DeserializeOwned>(text: &str) -> Result<Vec<T>, Error> {
    serde_saphyr::from_multiple_with_options(text, options())
        .map_err(|e| Error::new(String::new(), &e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Item {
        name: String,
        #[serde(default)]
        n: u32,
        #[serde(default)]
        on: bool,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Doc {
        items: Vec<Item>,
    }

    fn err(text: &str) -> Error {
        from_str::<Doc>(text).expect_err("invalid")
    }

    #[test]
    fn errors_name_the_field_and_the_position() {
        let e = err("items:\n  - name: a\n    n: x\n");
        assert_eq!(e.path, "items[0].n");
        assert_eq!((e.line, e.column), (Some(3), Some(8)));
        assert!(e.to_string().starts_with("items[0].n: "), "{e}");
        assert!(e.to_string().contains("line 3"), "{e}");

        let e = err("items:\n  - name: a\n    bogus: 1\n");
        assert!(e.to_string().contains("unknown field `bogus`"), "{e}");
        let e = err("items:\n  - n: 1\n");
        assert!(e.to_string().contains("missing field `name`"), "{e}");
        let e = err("items: [\n  - name: a\n");
        assert_eq!(e.line, Some(2), "{e}");
        let e = err("items: []\nitems: []\n");
        assert!(e.to_string().contains("duplicate"), "{e}");
        let e = err("items: []\n---\nitems: []\n");
        assert!(e.to_string().contains("multiple"), "{e}");
    }

    #[test]
    fn only_true_and_false_are_booleans() {
        let e = err("items:\n  - name: a\n    on: yes\n");
        assert_eq!(e.path, "items[0].on");
        let d: Doc = from_str("items:\n  - name: yes\n    on: true\n").expect("valid");
        assert_eq!(d.items[0].name, "yes");
        // Where text is due, a number or boolean reads as written; a null is refused.
        let d: Doc = from_str("items:\n  - name: 12\n  - name: true\n").expect("valid");
        assert_eq!(
            (d.items[0].name.as_str(), d.items[1].name.as_str()),
            ("12", "true")
        );
        let e = err("items:\n  - name: ~\n");
        assert_eq!(e.path, "items[0].name");
        let v: serde_json::Value = from_str("a: yes\nb: off\nc: true\n").expect("valid");
        assert_eq!(v, serde_json::json!({"a": "yes", "b": "off", "c": true}));
    }

    #[test]
    fn untyped_values_read_as_before() {
        let v: serde_json::Value =
            from_str("a: 1\nb: 1.5\nc: 0x10\nd: ~\ne: '1'\nf: 0755\ng: 1_000\nh: .inf\n3: x\n")
                .expect("valid");
        assert_eq!(
            v,
            serde_json::json!({
                "a": 1, "b": 1.5, "c": 16, "d": null, "e": "1", "f": "0755", "g": "1_000",
                "h": null, "3": "x",
            })
        );
        assert!(from_str::<serde_json::Value>("a: !custom x\n").is_err());
        assert_eq!(
            from_str::<Option<Vec<u32>>>("# nothing\n").expect("empty"),
            None
        );
        let docs: Vec<serde_json::Value> =
            from_str_multiple("---\na: 1\n---\n# empty\n---\nb: 2\n").expect("stream");
        assert_eq!(
            docs,
            [serde_json::json!({"a": 1}), serde_json::json!({"b": 2})]
        );
    }
}
