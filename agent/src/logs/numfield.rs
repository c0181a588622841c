//! A fast path for the commonest kind of preset field: a literal, optional whitespace,
//! then a number, as in Megatron-LM's `| lm loss: 2.345E+00 |`.
//!
//! A field regex of exactly the form `[\b]LITERAL[\s*](?P<v>%NUM%)` (or with `\d+` for the
//! value) is read by [`LiteralNumber::find`]: `memmem` for the literal, then a hand-written
//! scanner for the number that follows the regex's rules byte for byte. It gives the
//! regex's leftmost match or [`Scan::Absent`]; wherever the regex's Unicode classes could
//! differ from ASCII (a non-ASCII byte before the literal under `\b`, or where whitespace
//! or a digit may stand) it answers [`Scan::Unsure`] and the caller runs the regex, so
//! the result is always the regex's. A test holds the two to that on many lines.

use memchr::memmem;

/// What the value after the literal may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Value {
    /// The presets' `%NUM%`: a number as Python or C prints it, `nan`, `inf`.
    Num,
    /// `\d+`.
    Digits,
}

/// Where the field's value is, if the fast path can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scan {
    /// The value's byte span (the regex's group `v`).
    Found(usize, usize),
    /// The regex does not match.
    Absent,
    /// Only the regex can tell.
    Unsure,
}

/// A compiled `[\b]LITERAL[\s*](?P<v>VALUE)` field.
#[derive(Debug, Clone)]
pub(crate) struct LiteralNumber {
    finder: memmem::Finder<'static>,
    /// `\b` before the literal (whose first byte is then a word byte).
    word_start: bool,
    /// `\s*` between the literal and the value.
    spaces: bool,
    value: Value,
}

/// The value group as the presets write it, before `%NUM%` is expanded.
const NUM_GROUP: &str = "(?P<v>%NUM%)";
const DIGITS_GROUP: &str = r"(?P<v>\d+)";

impl LiteralNumber {
    /// The fast form of the field regex `pattern` (as written, `%NUM%` not expanded),
    /// when it has the one shape this handles.
    pub(crate) fn parse(pattern: &str) -> Option<LiteralNumber> {
        let (head, value) = if let Some(h) = pattern.strip_suffix(NUM_GROUP) {
            (h, Value::Num)
        } else {
            (pattern.strip_suffix(DIGITS_GROUP)?, Value::Digits)
        };
        let (head, spaces) = match head.strip_suffix(r"\s*") {
            Some(h) => (h, true),
            None => (head, false),
        };
        let (head, word_start) = match head.strip_prefix(r"\b") {
            Some(h) => (h, true),
            None => (head, false),
        };
        let literal = unescape_literal(head)?;
        if literal.is_empty() || (word_start && !is_word_byte(literal[0])) {
            return None;
        }
        Some(LiteralNumber {
            finder: memmem::Finder::new(&literal).into_owned(),
            word_start,
            spaces,
            value,
        })
    }

    /// The regex's leftmost match's value span in `text`, or why there is none.
    pub(crate) fn find(&self, text: &str) -> Scan {
        let bytes = text.as_bytes();
        let mut from = 0;
        while let Some(at) = self.finder.find(&bytes[from..]) {
            let start = from + at;
            from = start + 1;
            if self.word_start && start > 0 {
                let prev = bytes[start - 1];
                if !prev.is_ascii() {
                    return Scan::Unsure;
                }
                if is_word_byte(prev) {
                    continue;
                }
            }
            let mut i = start + self.finder.needle().len();
            if self.spaces {
                while let Some(&b) = bytes.get(i) {
                    if is_regex_space(b) {
                        i += 1;
                    } else if b.is_ascii() {
                        break;
                    } else {
                        return Scan::Unsure;
                    }
                }
            }
            let end = match self.value {
                Value::Num => scan_num(bytes, i),
                Value::Digits => scan_digits(bytes, i).map(|end| (end > i).then_some(end)),
            };
            match end {
                None => return Scan::Unsure,
                Some(Some(end)) => return Scan::Found(i, end),
                // No value here; the regex would try the literal's next occurrence.
                Some(None) => {}
            }
        }
        Scan::Absent
    }
}

/// The bytes a regex of literal characters and `\`-escaped ASCII punctuation matches;
/// `None` for anything else (classes, repetition, groups, other escapes).
fn unescape_literal(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                let e = chars.next()?;
                if !e.is_ascii_punctuation() {
                    return None;
                }
                out.push(e as u8);
            }
            '.' | '^' | '$' | '|' | '?' | '*' | '+' | '(' | ')' | '[' | ']' | '{' | '}' => {
                return None;
            }
            // Keep to ASCII: case-insensitive or Unicode-aware matching never enters.
            c if c.is_ascii() && !c.is_ascii_control() => out.push(c as u8),
            _ => return None,
        }
    }
    Some(out)
}

/// An ASCII byte of `\w`.
fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// An ASCII byte of the regex's `\s` (which, unlike `u8::is_ascii_whitespace`, has
/// the vertical tab).
fn is_regex_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

/// After ASCII digits from `i`: `Some(end)`, or `None` when a non-ASCII byte follows
/// (a Unicode digit, for all the fast path knows).
fn scan_digits(bytes: &[u8], mut i: usize) -> Option<usize> {
    while let Some(&b) = bytes.get(i) {
        if b.is_ascii_digit() {
            i += 1;
        } else if b.is_ascii() {
            break;
        } else {
            return None;
        }
    }
    Some(i)
}

/// `%NUM%` at `i`, leftmost-first like the regex:
/// `[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|(?i:nan|inf(?:inity)?))`.
/// `Some(Some(end))` on a match, `Some(None)` when there is none, `None` when a
/// non-ASCII byte stands where a digit could.
fn scan_num(bytes: &[u8], start: usize) -> Option<Option<usize>> {
    let at = |i: usize| bytes.get(i).copied();
    let mut i = start;
    if matches!(at(i), Some(b'-' | b'+')) {
        i += 1;
    }
    let body = i;
    // \d+\.?\d*
    let int_end = scan_digits(bytes, i)?;
    let mut end = None;
    if int_end > body {
        i = int_end;
        if at(i) == Some(b'.') {
            i = scan_digits(bytes, i + 1)?;
        }
        end = Some(i);
    } else if at(body) == Some(b'.') {
        // \.\d+
        let frac_end = scan_digits(bytes, body + 1)?;
        if frac_end > body + 1 {
            end = Some(frac_end);
        }
    }
    if let Some(mantissa_end) = end {
        // (?:[eE][-+]?\d+)?, taken only when complete.
        let mut j = mantissa_end;
        if matches!(at(j), Some(b'e' | b'E')) {
            j += 1;
            if matches!(at(j), Some(b'-' | b'+')) {
                j += 1;
            }
            let exp_end = scan_digits(bytes, j)?;
            if exp_end > j {
                return Some(Some(exp_end));
            }
        }
        return Some(Some(mantissa_end));
    }
    // (?i:nan|inf(?:inity)?)
    let rest = bytes.get(body..).unwrap_or(&[]);
    if let Some(&b) = rest.first()
        && !b.is_ascii()
    {
        return None;
    }
    let starts =
        |word: &[u8]| rest.len() >= word.len() && rest[..word.len()].eq_ignore_ascii_case(word);
    if starts(b"nan") {
        return Some(Some(body + 3));
    }
    if starts(b"infinity") {
        return Some(Some(body + 8));
    }
    if starts(b"inf") {
        return Some(Some(body + 3));
    }
    Some(None)
}

#[cfg(test)]
mod tests {
    use regex::Regex;

    use super::*;
    use crate::logs::presets::NUM;

    /// Every shipped field regex of the fast shape, and a few written for the test.
    fn patterns() -> Vec<String> {
        let mut out: Vec<String> = [
            r"\blm loss:\s*(?P<v>%NUM%)",
            r"tokens per GPU \(tokens/s/GPU\):\s*(?P<v>%NUM%)",
            r"number of nan iterations:\s*(?P<v>\d+)",
            r"samples/sec: (?P<v>%NUM%)",
            r"\bx(?P<v>%NUM%)",
            r"aa(?P<v>\d+)",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let yaml = include_str!("../../../rules/log-presets.yaml");
        let raw: Vec<serde_json::Value> =
            warden_model::yaml::from_str(yaml).expect("presets parse");
        for p in raw {
            if let Some(fields) = p.get("fields").and_then(|f| f.as_object()) {
                for re in fields.values() {
                    out.push(re.as_str().expect("field regex is a string").to_string());
                }
            }
        }
        out
    }

    fn lines() -> Vec<String> {
        let mut out: Vec<String> = [
            " iteration 100/ 1000 | elapsed time per iteration (ms): 1234.5 | learning rate: 1.000E-04 | global batch size:   512 | lm loss: 2.345E+00 | loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations: 0 | number of nan iterations:   3 |",
            "lm loss: nan | grad norm: -inf | learning rate: INFINITY",
            "xlm loss: 1.0 | lm loss: 2.0",
            "lm loss:\u{a0}3.0 | grad norm:\t\x0b 4.5e | learning rate: .5e+3x",
            "élm loss: 1 | alm loss: 2 | _lm loss: 3",
            "lm loss: - | lm loss: +. | lm loss: .e5 | lm loss: 7.",
            "lm loss: \u{0663}.5 | number of nan iterations: \u{0663}",
            "samples/sec: 12.5 samples/sec: x samples/sec:  3",
            "aaa12 aa x1e5 x.5 xnan x-infinity yx3",
            "tokens per GPU (tokens/s/GPU): 4567.8 |",
            "",
            "lm loss:",
            "lm loss: 1e",
            "grad norm: NaNx inf",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        // Cut every line at every position: every partial value and literal.
        let whole: Vec<String> = out.clone();
        for l in &whole {
            for (i, _) in l.char_indices() {
                out.push(l[..i].to_string());
                out.push(l[i..].to_string());
            }
        }
        out
    }

    #[test]
    fn the_fast_path_finds_what_the_regex_finds() {
        let mut fast_shapes = 0;
        for pattern in patterns() {
            let Some(fast) = LiteralNumber::parse(&pattern) else {
                continue;
            };
            fast_shapes += 1;
            let re = Regex::new(&pattern.replace("%NUM%", NUM)).expect("regex");
            for line in lines() {
                let want = re
                    .captures(&line)
                    .and_then(|c| c.name("v"))
                    .map(|m| (m.start(), m.end()));
                match fast.find(&line) {
                    Scan::Found(a, b) => assert_eq!(Some((a, b)), want, "{pattern} on {line:?}"),
                    Scan::Absent => assert_eq!(None, want, "{pattern} on {line:?}"),
                    Scan::Unsure => assert!(!line.is_ascii(), "{pattern} unsure on {line:?}"),
                }
            }
        }
        assert!(fast_shapes >= 10, "the Megatron fields take the fast path");
    }

    #[test]
    fn only_the_one_shape_is_taken() {
        for pattern in [
            r"\sloss: (?P<v>%NUM%)",
            r"[\s,]grad_norm=(?P<v>%NUM%)",
            r"lm.loss: (?P<v>%NUM%)",
            r"(?i)lm loss: (?P<v>%NUM%)",
            r"\b(x(?P<v>%NUM%)",
            r"lm loss: (?P<v>%NUM%)x",
            r"lm lossé: (?P<v>%NUM%)",
            r"(?P<v>%NUM%)",
        ] {
            assert!(LiteralNumber::parse(pattern).is_none(), "{pattern}");
        }
    }
}
