//! The log format of Warden's binaries: every message and field value written with its
//! control characters escaped, so that one event is always one line and nothing a log
//! line, a node name or a request carries can forge a line or drive a terminal.
//!
//! Text logs go through [`EscapedFields`]: C0 controls (`\n`, `\r`, `\t`, ESC, NUL...),
//! DEL, C1 controls and the Unicode line and paragraph separators are written as `\n`,
//! `\r`, `\t`, `\0` or `\u{1b}`. JSON logs are escaped by serde for everything below
//! U+0020; [`JsonControls`] adds DEL, C1 and the two separators, which JSON allows raw.

use std::borrow::Cow;
use std::fmt::{self, Write as _};
use std::io::{self, IsTerminal as _};

use tracing::field::{Field, Visit};
use tracing::{Metadata, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FormatFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;

/// How log events are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The log layer every Warden binary installs: `format` on stderr, with every field
/// escaped; text is coloured only when stderr is a terminal and `NO_COLOR` is unset, so
/// a log file or a container log holds no escape sequence at all. Filters are the
/// caller's.
pub fn stderr_layer<S>(format: LogFormat) -> Box<dyn Layer<S> + Send + Sync + 'static>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let colour =
        io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    build(format, io::stderr, colour)
}

/// [`stderr_layer`] writing to `make_writer` instead, never coloured.
pub fn layer<S, W>(format: LogFormat, make_writer: W) -> Box<dyn Layer<S> + Send + Sync + 'static>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    build(format, make_writer, false)
}

/// The layer, with ANSI colours of the level, target and field names on or off (values
/// are escaped either way).
fn build<S, W>(
    format: LogFormat,
    make_writer: W,
    ansi: bool,
) -> Box<dyn Layer<S> + Send + Sync + 'static>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    match format {
        // A log line that cannot be written (stderr closed) is dropped: the layer's own
        // report of it would go to the same stderr, with `eprintln!`, which panics.
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .fmt_fields(EscapedFields)
            .with_writer(make_writer)
            .with_ansi(ansi)
            .log_internal_errors(false)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(JsonControls(make_writer))
            .log_internal_errors(false)
            .boxed(),
    }
}

/// Whether `c` is written escaped: a C0 or C1 control, DEL, or a Unicode line or
/// paragraph separator.
pub fn needs_escape(c: char) -> bool {
    c.is_control() || c == '\u{2028}' || c == '\u{2029}'
}

/// `s` with every character [`needs_escape`] picks written as `\n`, `\r`, `\t`, `\0` or
/// `\u{..}`; borrowed when there is none. Backslashes are left as they are.
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.contains(needs_escape) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    // Writing to a String cannot fail.
    let _ = Escaping(&mut out).write_str(s);
    Cow::Owned(out)
}

/// A `fmt::Write` that escapes what it passes on (see [`escape`]).
struct Escaping<'a, W: fmt::Write + ?Sized>(&'a mut W);

impl<W: fmt::Write + ?Sized> fmt::Write for Escaping<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut rest = s;
        while let Some(at) = rest.find(needs_escape) {
            self.0.write_str(&rest[..at])?;
            let mut tail = rest[at..].chars();
            let Some(c) = tail.next() else { break };
            match c {
                '\n' => self.0.write_str("\\n")?,
                '\r' => self.0.write_str("\\r")?,
                '\t' => self.0.write_str("\\t")?,
                '\0' => self.0.write_str("\\0")?,
                c => write!(self.0, "\\u{{{:x}}}", u32::from(c))?,
            }
            rest = tail.as_str();
        }
        self.0.write_str(rest)
    }
}

/// Formats the fields of text log events and spans like tracing-subscriber's default
/// (`message` first and bare, then `name=value`), with every message and value escaped
/// (see [`escape`]), whether it was recorded with `%`, `?`, as a string or as an error.
#[derive(Debug, Clone, Copy, Default)]
pub struct EscapedFields;

impl<'w> FormatFields<'w> for EscapedFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut visitor = EscapedVisitor {
            ansi: writer.has_ansi_escapes(),
            writer,
            empty: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct EscapedVisitor<'w> {
    writer: Writer<'w>,
    ansi: bool,
    empty: bool,
    result: fmt::Result,
}

impl EscapedVisitor<'_> {
    fn field(&mut self, field: &Field, value: fmt::Arguments<'_>) {
        let name = field.name();
        // Metadata of events from the `log` crate, already written by the event format.
        if self.result.is_err() || name.starts_with("log.") {
            return;
        }
        let pad = if std::mem::take(&mut self.empty) {
            ""
        } else {
            " "
        };
        self.result = self.writer.write_str(pad).and_then(|()| {
            if name != "message" {
                // Field names come from the code, never from outside.
                let name = name.strip_prefix("r#").unwrap_or(name);
                if self.ansi {
                    write!(self.writer, "\x1b[3m{name}\x1b[0m\x1b[2m=\x1b[0m")?;
                } else {
                    write!(self.writer, "{name}=")?;
                }
            }
            Escaping(&mut self.writer).write_fmt(value)
        });
    }
}

impl Visit for EscapedVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.field(field, format_args!("{value}"));
        } else {
            self.field(field, format_args!("{value:?}"));
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        let mut sources = Vec::new();
        let mut next = value.source();
        while let Some(e) = next {
            sources.push(e.to_string());
            next = e.source();
        }
        if sources.is_empty() {
            self.field(field, format_args!("{value}"));
        } else {
            let name = field.name();
            self.field(field, format_args!("{value} {name}.sources={sources:?}"));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.field(field, format_args!("{value:?}"));
    }
}

/// A [`MakeWriter`] for JSON log lines that also escapes DEL, the C1 controls and the
/// Unicode line and paragraph separators (as `\u007f`, `\u0085`, `\u2028`...), which
/// JSON allows raw in strings. serde already escapes everything below U+0020, and these
/// can only occur inside strings, so the line stays the same JSON.
#[derive(Debug, Clone)]
pub struct JsonControls<M>(pub M);

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for JsonControls<M> {
    type Writer = JsonControlsWriter<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        JsonControlsWriter(self.0.make_writer())
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> Self::Writer {
        JsonControlsWriter(self.0.make_writer_for(meta))
    }
}

/// The writer of [`JsonControls`]: passes each write on whole, escaped.
#[derive(Debug)]
pub struct JsonControlsWriter<W>(W);

impl<W: io::Write> io::Write for JsonControlsWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        let mut start = 0;
        let mut i = 0;
        while i < buf.len() {
            let escaped = match buf[i..] {
                [0x7f, ..] => Some((0x7f, 1)),
                [0xc2, b @ 0x80..=0x9f, ..] => Some((u32::from(b), 2)),
                [0xe2, 0x80, b @ (0xa8 | 0xa9), ..] => Some((0x2000 + u32::from(b) - 0x80, 3)),
                _ => None,
            };
            match escaped {
                Some((code, len)) => {
                    self.0.write_all(&buf[start..i])?;
                    write!(self.0, "\\u{code:04x}")?;
                    i += len;
                    start = i;
                }
                None => i += 1,
            }
        }
        self.0.write_all(&buf[start..])
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::layer::SubscriberExt as _;

    use super::*;

    /// Log lines written to memory.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn text(&self) -> String {
            let bytes = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
            String::from_utf8(bytes).expect("log output is UTF-8")
        }
    }

    const HOSTILE: &str = "a\nb\u{1b}[31m\r\t\0\u{7f}\u{9b}2J\u{85}\u{2028}z";

    /// Run `emit` under the shared layer in `format` (ANSI colours on or off) and return
    /// what it wrote.
    fn logged_ansi(format: LogFormat, ansi: bool, emit: impl FnOnce()) -> String {
        let out = Captured::default();
        let sink = out.clone();
        let subscriber =
            tracing_subscriber::registry().with(build(format, move || sink.clone(), ansi));
        tracing::subscriber::with_default(subscriber, emit);
        out.text()
    }

    /// As a binary whose stderr is not a terminal logs.
    fn logged(format: LogFormat, emit: impl FnOnce()) -> String {
        logged_ansi(format, false, emit)
    }

    fn assert_one_clean_line(out: &str) {
        assert_eq!(out.matches('\n').count(), 1, "one event, one line: {out:?}");
        assert!(out.ends_with('\n'), "{out:?}");
        let body = &out[..out.len() - 1];
        let bad: Vec<char> = body.chars().filter(|&c| needs_escape(c)).collect();
        assert!(bad.is_empty(), "raw control characters {bad:?} in {out:?}");
    }

    #[derive(Debug)]
    struct Outer(std::io::Error);

    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("outer\nfailure")
        }
    }

    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_text_log_event_is_one_line_without_raw_control_characters() {
        for (what, out) in [
            (
                "display field",
                logged(
                    LogFormat::Text,
                    || tracing::info!(node = %"a\nb\u{1b}[31m", "x"),
                ),
            ),
            (
                "every kind of field",
                logged(LogFormat::Text, || {
                    let err = Outer(std::io::Error::other("inner\r\nfake"));
                    tracing::warn!(
                        node = %HOSTILE,
                        job = HOSTILE,
                        ranks = ?[HOSTILE],
                        error = &err as &(dyn std::error::Error + 'static),
                        "message {HOSTILE}"
                    );
                }),
            ),
            (
                "span fields",
                logged(LogFormat::Text, || {
                    let span = tracing::info_span!("drain", node = %HOSTILE, actor = tracing::field::Empty);
                    span.record("actor", tracing::field::display(HOSTILE));
                    let _in = span.enter();
                    tracing::info!("node drained");
                }),
            ),
            (
                "bare message",
                logged(LogFormat::Text, || tracing::error!("{}", HOSTILE)),
            ),
        ] {
            assert_one_clean_line(&out);
            assert!(out.contains(r"a\nb\u{1b}[31m"), "{what}: {out:?}");
        }
    }

    #[test]
    fn a_coloured_text_log_event_is_one_line_and_only_the_colours_are_raw() {
        let out = logged_ansi(LogFormat::Text, true, || {
            tracing::info!(node = %"a\nb\u{1b}[31m", "x\u{1b}[2J");
        });
        assert_eq!(out.matches('\n').count(), 1, "{out:?}");
        assert!(out.contains(r"a\nb\u{1b}[31m"), "{out:?}");
        assert!(out.contains(r"x\u{1b}[2J"), "{out:?}");
        assert!(
            !out.contains("\u{1b}[31m") && !out.contains("\u{1b}[2J"),
            "{out:?}"
        );
    }

    #[test]
    fn text_log_values_read_as_before_apart_from_the_escapes() {
        let out = logged(LogFormat::Text, || {
            tracing::info!(node = %"gpu-1", job = "train", n = 3, "incident changed");
        });
        assert!(
            out.contains(r#"incident changed node=gpu-1 job="train" n=3"#),
            "{out:?}"
        );
    }

    #[test]
    fn a_json_log_event_is_one_line_without_raw_control_characters() {
        let out = logged(LogFormat::Json, || {
            let span = tracing::info_span!("drain", node = %HOSTILE);
            let _in = span.enter();
            tracing::info!(node = %HOSTILE, job = HOSTILE, "message {HOSTILE}");
        });
        assert_eq!(out.matches('\n').count(), 1, "{out:?}");
        let body = out.trim_end_matches('\n');
        let bad: Vec<char> = body.chars().filter(|&c| needs_escape(c)).collect();
        assert!(bad.is_empty(), "raw control characters {bad:?} in {out:?}");
        // Still the same JSON, values intact.
        let v: serde_json::Value = serde_json::from_str(body).expect("one JSON object");
        assert_eq!(v["fields"]["node"], HOSTILE);
        assert_eq!(v["fields"]["job"], HOSTILE);
        assert_eq!(v["fields"]["message"], format!("message {HOSTILE}"));
        assert_eq!(v["span"]["node"], HOSTILE);
    }

    #[test]
    fn escape_writes_controls_as_rust_escapes_and_leaves_the_rest() {
        assert_eq!(
            escape(HOSTILE),
            r"a\nb\u{1b}[31m\r\t\0\u{7f}\u{9b}2J\u{85}\u{2028}z"
        );
        assert!(matches!(
            escape("gpu-1 ✓ \\n"),
            Cow::Borrowed("gpu-1 ✓ \\n")
        ));
    }

    #[test]
    fn json_controls_passes_other_utf8_through() {
        let mut w = JsonControlsWriter(Vec::new());
        io::Write::write_all(&mut w, "{\"a\":\"é✓\u{7f}\u{85}\u{2029}\"}".as_bytes())
            .expect("write");
        assert_eq!(
            String::from_utf8(w.0).expect("utf8"),
            r#"{"a":"é✓\u007f\u0085\u2029"}"#
        );
    }
}
