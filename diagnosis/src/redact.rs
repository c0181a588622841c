//! Redaction of log text before it leaves the process: secrets always, host names and
//! IP addresses on request (replaced by stable pseudonyms that can be translated back).
//!
//! What is removed, and what deliberately is not:
//!
//! | removed (`[REDACTED:<kind>]`) | examples |
//! |---|---|
//! | private keys | a PEM `-----BEGIN ... PRIVATE KEY-----` block, or its start when cut |
//! | API tokens by shape | `sk-...`, `ghp_...`/`github_pat_...`, `xoxb-...`, `hf_...`, `glpat-...`, `dckr_pat_...`, `npm_...`, `pypi-AgE...`, `ya29....`, `AIza...`, `AKIA...`, Warden's own `wdn_...`, JWTs, `Bearer ...` |
//! | Authorization headers | `Authorization: Bearer x`, `Proxy-Authorization: Basic x`, `{"authorization": "token x"}` (the scheme stays) |
//! | values of secret keys | `password=x`, `DB_PASSWORD=x`, `api_key: x`, `"apiKey": "x"`, `\"db_password\": \"x\"`, `?access_token=x&` |
//! | values of secret flags | `--db-password x`, `--api-key=x`, `-password x`, `-srcstorepass x`, `'--hub_token', 'x'` |
//! | command passwords | `mysql -uroot -pSECRET`, `sshpass -p x`, `docker login -p x`, `redis-cli -a x`, `curl -u user:x`, `wandb login KEY`, `.netrc` `password x` |
//! | URL credentials | `https://user:pass@host`, `redis://:pass@host` |
//! | e-mail addresses | `alice@example.com` |
//! | bare base64 blobs | 40+ characters mixing upper, lower and digits, at most one `/` per 16 characters (PEM body lines, cloud secret keys) |
//!
//! A key or flag names a secret by its word parts (split at `_`, `-`, `.`, camelCase
//! humps and digits): it contains `password`, `passwd`,
//! `passphrase`, `secret` or `credential`, or its last part is `token`, `key`, `pass`,
//! `pwd`, `auth`, `sig` or a compound of them (`apikey`, `HFTOKEN`, `storepass`).
//! Innocent words stay: `monkey`, `keyboard`, `KeyError`, `tokenizer`,
//! `tokens_per_second`, `max_tokens`, `num_key_value_heads`, `eos_token`, `sort_key`,
//! `--password-stdin`, `password_file`, `PWD=/path`, and values that are no secret
//! (`${VAR}`, `****`, `true`, `null`, a small number after `token` or `key`). The key or
//! flag itself always stays; only its value is replaced.
//!
//! Within a batch ([`Redactor::redact_batch`]) a secret value found in one string (say
//! `password=hunter2x` in a log line) is also removed wherever it recurs bare in the
//! others (the same password quoted in an explanation), if it is 6 characters or more.
//!
//! Kept on purpose, because diagnosis needs them and they are not secrets: rank numbers,
//! PCI bus ids (`0000:3b:00.0`), XID codes, GPU UUIDs, CUDA error names, versions,
//! paths, and hexadecimal numbers of any length when no secret key names them (NCCL
//! communicator hashes and ids such as `commHash 0x7f3a9b2c1d4e5f60`, addresses, git
//! hashes). A hex string only goes when it is the value of a secret key (`token=9f...`).
//!
//! Host names and IP addresses are kept unless configured otherwise; when redacted each
//! distinct one becomes `host-N` / `ip-N`, the same one always the same pseudonym within
//! one [`Pseudonyms`] map, so the model can still tell nodes apart and its answer can be
//! translated back with [`Pseudonyms::reveal`]. Host names are found by the caller's list
//! of known names (e.g. the nodes a rules answer names), by their position in common log
//! prefixes (NCCL `host:pid:tid`, syslog, `hostname=`), as fully qualified names with a
//! common suffix, and as dashed names ending in a number (`gpu-node-26`, except common
//! words such as `utf-8`, `rank-3`, `cuda-12` and path components); every occurrence of a name found anywhere in a batch is replaced in
//! every line of it.
//!
//! Each line is scanned once by a [`RegexSet`] that says which patterns occur; only those
//! are then run, each value after a key or flag read once and at most 4 KiB ahead
//! before it is judged, so the cost is linear in the line's length. Redaction is a pure
//! function of its input and the pseudonym map.

use std::collections::HashMap;
use std::fmt;
use std::net::Ipv6Addr;
use std::sync::OnceLock;

use regex::{Regex, RegexSet, RegexSetBuilder};

/// What to do with host names and IP addresses (secrets are always removed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RedactOptions {
    /// Replace host names by `host-N` pseudonyms.
    pub hosts: bool,
    /// Replace IPv4 and IPv6 addresses by `ip-N` pseudonyms.
    pub ips: bool,
}

/// The local map between real host names / addresses and their pseudonyms. It never
/// leaves the process.
#[derive(Debug, Clone, Default)]
pub struct Pseudonyms {
    hosts: HashMap<String, String>,
    ips: HashMap<String, String>,
    real: HashMap<String, String>,
}

impl Pseudonyms {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// The pseudonym of a host name (case-insensitive), assigning the next one if new.
    pub fn host(&mut self, name: &str) -> String {
        let key = name.to_ascii_lowercase();
        if let Some(p) = self.hosts.get(&key) {
            return p.clone();
        }
        let p = format!("host-{}", self.hosts.len() + 1);
        self.hosts.insert(key, p.clone());
        self.real.insert(p.clone(), name.to_owned());
        p
    }

    /// The pseudonym of an IP address, assigning the next one if new.
    pub fn ip(&mut self, addr: &str) -> String {
        let key = addr.to_ascii_lowercase();
        if let Some(p) = self.ips.get(&key) {
            return p.clone();
        }
        let p = format!("ip-{}", self.ips.len() + 1);
        self.ips.insert(key, p.clone());
        self.real.insert(p.clone(), addr.to_owned());
        p
    }

    /// The real name behind a pseudonym, if it is one of ours.
    pub fn real(&self, pseudonym: &str) -> Option<&str> {
        self.real.get(pseudonym).map(String::as_str)
    }

    /// `text` with every pseudonym of this map replaced by the real name. Words that
    /// look like pseudonyms but were never assigned are left alone.
    pub fn reveal(&self, text: &str) -> String {
        if self.real.is_empty() {
            return text.to_owned();
        }
        let Some(re) = pseudonym_re() else {
            return text.to_owned();
        };
        re.replace_all(text, |c: &regex::Captures<'_>| {
            let word = &c[0];
            self.real(word).unwrap_or(word).to_owned()
        })
        .into_owned()
    }

    /// Whether no pseudonym was assigned.
    pub fn is_empty(&self) -> bool {
        self.real.is_empty()
    }
}

fn pseudonym_re() -> Option<&'static Regex> {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    RE.get_or_init(|| compiled(r"\b(?:host|ip)-[0-9]+\b"))
        .as_ref()
}

/// Compiles a pattern of this module. The patterns are constants checked by the tests,
/// so failure is a bug here, not bad input: it is logged and the pattern left out.
fn compiled(pattern: &str) -> Option<Regex> {
    Regex::new(pattern)
        .inspect_err(|e| tracing::error!(error = %e, "redaction pattern does not compile"))
        .ok()
}

/// What a span is replaced by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A secret: replaced by `[REDACTED:<label>]`.
    Secret(&'static str),
    /// An IPv4 address.
    Ipv4,
    /// An IPv6 address (checked by parsing).
    Ipv6,
    /// A host name in a structural position (capture group 1).
    HostInPrefix,
    /// A fully qualified host name.
    Fqdn,
}

/// Which part of a match is replaced.
#[derive(Debug, Clone, Copy)]
enum Take {
    /// This capture group (0: the whole match).
    Group(usize),
    /// Group 1 is a key name followed by its separator (`name=`, `name: `,
    /// `"name": `); when the name is a secret's ([`secret_name`]), the value after the
    /// match is replaced.
    KeyValue,
    /// Group 1 is a flag's dashes and group 2 its name (`--name`, `-name`); when the
    /// name is a secret's, the value after `=`, or after spaces unless it is another
    /// flag, is replaced.
    Flag,
}

struct Pattern {
    kind: Kind,
    take: Take,
    source: &'static str,
    /// A check on the replaced text that the pattern alone cannot express.
    accept: fn(&str) -> bool,
}

fn always(_: &str) -> bool {
    true
}

/// A bare base64 blob: mixed case and digits, and few slashes (paths have many).
fn looks_like_base64_secret(s: &str) -> bool {
    let upper = s.bytes().any(|b| b.is_ascii_uppercase());
    let lower = s.bytes().any(|b| b.is_ascii_lowercase());
    let digit = s.bytes().any(|b| b.is_ascii_digit());
    let slashes = s.bytes().filter(|&b| b == b'/').count();
    upper && lower && digit && slashes * 16 <= s.len() && !s.starts_with('/')
}

/// An IPv6 candidate: it must parse, and groups of three or more letters without a digit
/// make it a C++ scope (`c10::add`), not an address.
fn looks_like_ipv6(s: &str) -> bool {
    s.parse::<Ipv6Addr>().is_ok()
        && s.split(':')
            .all(|g| g.len() < 3 || g.bytes().any(|b| b.is_ascii_digit()))
}

/// A value after a secret key that is not itself a stand-in for one: empty, already
/// redacted, masked (`****`), a reference to a variable (`$DB_PASSWORD`,
/// `${DB_PASSWORD}`) or a keyword (`true`, `null`, `none`, ...).
fn secret_value(s: &str) -> bool {
    let v = s.trim_matches(|c| c == '"' || c == '\'' || c == '\\');
    let keyword = matches!(
        v.to_ascii_lowercase().as_str(),
        "true" | "false" | "null" | "none" | "nil" | "yes" | "no" | "on" | "off"
    );
    !v.is_empty()
        && !v.starts_with("[REDACTED")
        && !v.bytes().all(|b| b == b'*')
        && !is_variable(v)
        && !keyword
}

/// `$NAME` or `${NAME}`: a reference to where the secret is, not the secret.
fn is_variable(v: &str) -> bool {
    let Some(rest) = v.strip_prefix('$') else {
        return false;
    };
    let name = rest
        .strip_prefix('{')
        .map_or(rest, |r| r.strip_suffix('}').unwrap_or(r));
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Shortest secret value that is also searched for in the other strings of a batch
/// (shorter ones would hit ordinary words).
const MIN_ECHOED_SECRET: usize = 6;

/// Names that hold a secret wherever the word occurs in them, even inside a longer
/// word (`PGPASSWORD`, `client_secret`, `X-Amz-Credential`).
const STRONG_WORDS: [&str; 5] = ["password", "passwd", "passphrase", "secret", "credential"];

/// Last word parts that make a name say where a secret is or what kind it is, not
/// what it is (`--password-stdin`, `password_file`, `secretName`, `credential.helper`).
const NOT_THE_SECRET: [&str; 16] = [
    "stdin", "file", "path", "dir", "env", "prompt", "length", "policy", "name", "ref", "id",
    "arn", "helper", "provider", "source", "type",
];

/// Words before `token` that make it a tokenizer's special token (`eos_token: "</s>"`).
const SPECIAL_TOKENS: [&str; 18] = [
    "pad",
    "eos",
    "bos",
    "unk",
    "sep",
    "cls",
    "mask",
    "special",
    "start",
    "end",
    "image",
    "audio",
    "video",
    "vision",
    "additional",
    "eot",
    "fim",
    "im",
];

/// Words before `key` that make it a lookup key, not a credential (`sort_key`,
/// `text_key`, `query_key_value`'s neighbours).
const LOOKUP_KEYS: [&str; 40] = [
    "sort",
    "cache",
    "primary",
    "foreign",
    "partition",
    "routing",
    "shard",
    "lookup",
    "dict",
    "index",
    "public",
    "row",
    "column",
    "hash",
    "group",
    "join",
    "metric",
    "monitor",
    "label",
    "input",
    "output",
    "text",
    "image",
    "caption",
    "audio",
    "video",
    "prompt",
    "response",
    "target",
    "sample",
    "data",
    "dataset",
    "feature",
    "field",
    "state",
    "model",
    "config",
    "query",
    "value",
    "batch",
];

/// Single words that end in a credential word (`apikey`, `keystorepass`).
const KEY_COMPOUNDS: [&str; 12] = [
    "apikey",
    "accesskey",
    "authkey",
    "privatekey",
    "sshkey",
    "sessionkey",
    "hmackey",
    "signingkey",
    "masterkey",
    "encryptionkey",
    "licensekey",
    "dbpass",
];

/// How a secret name's value is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SecretName {
    /// Any value is a secret.
    Always,
    /// Any value but a small plain number (`max_token=512` is not a credential).
    NotANumber,
    /// The shell's working directory (`PWD`, `OLDPWD`): a path is not a secret.
    NotAPath,
}

/// The word parts of a name, lower case: split at `_`, `-`, `.` and other
/// punctuation, at camelCase humps (`apiKey`, `APIKey`) and between letters and
/// digits; parts that are only digits are left out.
fn name_parts(name: &str) -> Vec<String> {
    let mut parts = Vec::new();
    for word in name.split(|c: char| !c.is_ascii_alphanumeric()) {
        let b = word.as_bytes();
        let mut start = 0;
        for i in 1..b.len() {
            let (prev, c) = (b[i - 1], b[i]);
            let next_lower = b.get(i + 1).is_some_and(u8::is_ascii_lowercase);
            let hump = (prev.is_ascii_lowercase() && c.is_ascii_uppercase())
                || (prev.is_ascii_uppercase() && c.is_ascii_uppercase() && next_lower)
                || prev.is_ascii_digit() != c.is_ascii_digit();
            if hump {
                parts.push(word[start..i].to_ascii_lowercase());
                start = i;
            }
        }
        if start < b.len() {
            parts.push(word[start..].to_ascii_lowercase());
        }
    }
    parts.retain(|p| !p.bytes().all(|b| b.is_ascii_digit()));
    parts
}

/// Whether a key or flag name is a secret's, and how its value is judged. A name is
/// a secret's when it contains `password`, `passwd`, `passphrase`, `secret` or
/// `credential` (unless its last word part says where the secret is: `_file`,
/// `-stdin`, `Name`, ...), or when its last word part is `token` (or ends in it),
/// `key` (or is a compound such as `apikey`), `pass`, `pwd` (or ends in it), `auth`,
/// `sig`, or `signature` after another part. `monkey`, `keyboard`, `tokenizer`,
/// `tokens_per_second`, `num_key_value_heads`, `KeyError`, `eos_token`, `sort_key`
/// are not.
fn secret_name(name: &str) -> Option<SecretName> {
    let lower = name.to_ascii_lowercase();
    if lower == "pwd" || lower == "oldpwd" {
        return Some(SecretName::NotAPath);
    }
    let parts = name_parts(name);
    let (last, before) = parts.split_last()?;
    let last = last.as_str();
    let prev = before.last().map(String::as_str);
    if STRONG_WORDS.iter().any(|w| lower.contains(w)) {
        return (!NOT_THE_SECRET.contains(&last)).then_some(SecretName::Always);
    }
    let named = match last {
        "token" => !prev.is_some_and(|p| SPECIAL_TOKENS.contains(&p)),
        "key" => !prev.is_some_and(|p| LOOKUP_KEYS.contains(&p)),
        "sig" => true,
        "signature" => prev.is_some(),
        l => l.ends_with("token"),
    };
    if named {
        return Some(SecretName::NotANumber);
    }
    let always = matches!(last, "pass" | "auth" | "passin" | "passout")
        || last.ends_with("pwd")
        || last.ends_with("storepass")
        || last.ends_with("keypass")
        || KEY_COMPOUNDS.contains(&last);
    always.then_some(SecretName::Always)
}

/// Whether `value`, given to `name`, is a secret.
fn secret_pair(name: &str, value: &str) -> bool {
    let Some(how) = secret_name(name) else {
        return false;
    };
    let v = value.trim_matches(|c| c == '"' || c == '\'' || c == '\\');
    secret_value(value)
        && match how {
            SecretName::Always => true,
            SecretName::NotANumber => !(v.len() <= 9 && v.bytes().all(|b| b.is_ascii_digit())),
            SecretName::NotAPath => !(v.starts_with('/') || v.starts_with('~')),
        }
}

/// Longest value read after a key or flag before it is judged, bytes; the bound keeps
/// redaction linear in the line's length whatever the line repeats. A secret value cut
/// here is then replaced up to the next white space.
const MAX_VALUE_BYTES: usize = 4096;

/// The value starting at `from` (after spaces and tabs), as a byte range: a quoted
/// string with its quotes (a `"..."` one honours `\"`; unclosed, it runs to the end of
/// the line), a JSON string inside a string (`\"...\"`), `${NAME}`, or a run up to
/// white space or one of `,;&"'}]`; never more than [`MAX_VALUE_BYTES`]. `None` when
/// there is none.
fn value_at(text: &str, from: usize) -> Option<(usize, usize)> {
    let b = text.as_bytes();
    let mut start = from;
    while b.get(start).is_some_and(|&c| c == b' ' || c == b'\t') {
        start += 1;
    }
    let mut limit = (start + MAX_VALUE_BYTES).min(b.len());
    while !text.is_char_boundary(limit) {
        limit -= 1;
    }
    let rest = b.get(start..limit)?;
    // Up to the closing byte (included) or the end of the line or of the window.
    let closing = |open: usize, close: &[u8], escapes: bool| {
        let mut i = open;
        while i < rest.len() {
            match rest[i] {
                b'\n' | b'\r' => return start + i,
                b'\\' if escapes && i + 1 < rest.len() && rest[i + 1] != b'\n' => i += 2,
                _ if rest[i..].starts_with(close) => return start + i + close.len(),
                _ => i += 1,
            }
        }
        limit
    };
    let end = match rest {
        [] => return None,
        [b'\\', b'"', ..] => closing(2, b"\\\"", false),
        [b'"', ..] => closing(1, b"\"", true),
        [b'\'', ..] => closing(1, b"'", false),
        [b'$', b'{', ..] => closing(2, b"}", false),
        _ => {
            let stop = |c: u8| c.is_ascii_whitespace() || b",;&\"'}]".contains(&c);
            let run = rest.iter().position(|&c| stop(c)).unwrap_or(rest.len());
            // `...\"` ends a value inside an escaped JSON string.
            let run = match rest[..run].iter().position(|&c| c == b'\\') {
                Some(i) if rest.get(i + 1) == Some(&b'"') => i,
                _ => run,
            };
            start + run
        }
    };
    (end > start).then_some((start, end))
}

/// `(start, end)` of a secret value, carried on to the next white space when
/// [`value_at`] cut it at [`MAX_VALUE_BYTES`]. Runs once per secret, as the search goes
/// on after it.
fn whole_secret(text: &str, (start, end): (usize, usize)) -> (usize, usize) {
    if end - start < MAX_VALUE_BYTES {
        return (start, end);
    }
    let rest = &text.as_bytes()[end..];
    let run = rest
        .iter()
        .position(u8::is_ascii_whitespace)
        .unwrap_or(rest.len());
    (start, end + run)
}

/// What reading a key or flag found: the secret value's span, if it is one, and where
/// the search goes on (after the value when there was one, so no value is read twice).
struct Read {
    secret: Option<(usize, usize)>,
    resume: usize,
}

/// The value of a key whose name and separator `caps` matched.
fn key_value(text: &str, caps: &regex::Captures<'_>) -> Option<Read> {
    let (whole, name) = (caps.get(0)?, caps.get(1)?);
    let skip = Read {
        secret: None,
        resume: whole.end(),
    };
    if !name
        .as_str()
        .starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        || secret_name(name.as_str()).is_none()
    {
        return Some(skip);
    }
    let sep = text[..whole.end()].bytes().next_back()?;
    let mut from = whole.end();
    match (sep, text.as_bytes().get(from)) {
        // `a == b` and `a::b` are not assignments; `a := b` is.
        (b'=', Some(b'=')) | (b':', Some(b':')) => return Some(skip),
        (b':', Some(b'=')) => from += 1,
        _ => {}
    }
    let Some((start, end)) = value_at(text, from) else {
        return Some(skip);
    };
    let secret =
        secret_pair(name.as_str(), &text[start..end]).then(|| whole_secret(text, (start, end)));
    Some(Read {
        resume: secret.map_or(end, |(_, e)| e),
        secret,
    })
}

/// The value of a flag whose dashes and name `caps` matched: after `=`, after spaces
/// (unless it starts like another flag or a shell operator), or, in an argument list
/// (`'--token', 'x'`), the next quoted element. A single dash, a letter and then a
/// capital or a digit is a short option with its value attached (`-pS3cret`, which
/// the command patterns read), not a name.
fn flag_value(text: &str, caps: &regex::Captures<'_>) -> Option<Read> {
    let (dashes, name) = (caps.get(1)?, caps.get(2)?);
    let skip = Read {
        secret: None,
        resume: name.end(),
    };
    let b = name.as_str().as_bytes();
    let attached = dashes.len() == 1
        && b.get(1)
            .is_some_and(|c| c.is_ascii_uppercase() || c.is_ascii_digit());
    if !b.first().is_some_and(u8::is_ascii_alphabetic)
        || attached
        || secret_name(name.as_str()).is_none()
    {
        return Some(skip);
    }
    let after = &text[name.end()..];
    let value = match after.as_bytes().first() {
        Some(b'=') => value_at(text, name.end() + 1),
        Some(b' ' | b'\t') => value_at(text, name.end())
            .filter(|&(start, _)| !text[start..].starts_with(['-', '|', '&', ';', '>', '<', '#'])),
        Some(&q @ (b'"' | b'\'')) => after[1..].strip_prefix(',').and_then(|rest| {
            let at = name.end() + 2 + (rest.len() - rest.trim_start().len());
            (text.as_bytes().get(at) == Some(&q))
                .then(|| value_at(text, at))
                .flatten()
        }),
        _ => None,
    };
    let Some((start, end)) = value else {
        return Some(skip);
    };
    let secret =
        secret_pair(name.as_str(), &text[start..end]).then(|| whole_secret(text, (start, end)));
    Some(Read {
        resume: secret.map_or(end, |(_, e)| e),
        secret,
    })
}

/// Arguments of a command up to the one looked for (lazily: the first such).
macro_rules! command_args {
    () => {
        r"(?:[ \t]+[^\s|;&]+)*?[ \t]+"
    };
}
/// A command-line value: quoted (with `\"` in a double-quoted one) or a run.
macro_rules! arg_value {
    () => {
        r#"("(?:[^"\\]|\\.)*"|'[^']*'|[^\s"']\S*)"#
    };
}

fn patterns() -> Vec<Pattern> {
    // Order matters only for spans that start at the same place: the longer wins.
    let s = |kind, take, source, accept| Pattern {
        kind: Kind::Secret(kind),
        take,
        source,
        accept,
    };
    let g = Take::Group;
    vec![
        s(
            "private-key",
            g(0),
            r"(?s)-----BEGIN [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----|\z)",
            always,
        ),
        s("token", g(0), r"\bsk-[A-Za-z0-9_-]{16,}", always),
        s(
            "token",
            g(0),
            r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})",
            always,
        ),
        s("token", g(0), r"\bxox[abposr]-[A-Za-z0-9-]{10,}", always),
        s("token", g(0), r"\bhf_[A-Za-z0-9]{30,}", always),
        // GitLab, Docker Hub, npm, PyPI and Google OAuth tokens.
        s(
            "token",
            g(0),
            r"\b(?:glpat-[A-Za-z0-9_-]{20,}|dckr_pat_[A-Za-z0-9_-]{20,}|npm_[A-Za-z0-9]{36,}|pypi-AgE[A-Za-z0-9_-]{50,}|ya29\.[A-Za-z0-9_-]{20,})",
            always,
        ),
        // Warden's own API and agent tokens (`warden-controller token`): bare hex, which
        // is otherwise kept, so their prefix is what gives them away.
        s("token", g(0), r"\bwdn_[0-9A-Fa-f]{32,}", always),
        s("token", g(0), r"\bAIza[0-9A-Za-z_-]{35}", always),
        s(
            "aws-key",
            g(0),
            r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA)[A-Z0-9]{16}\b",
            always,
        ),
        s(
            "jwt",
            g(0),
            r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}",
            always,
        ),
        s(
            "token",
            g(1),
            r"(?i)\b(?:bearer|basic|token)\s+([A-Za-z0-9._~+/=-]{8,})",
            looks_like_credential,
        ),
        // An Authorization header's credentials, whatever they look like; the scheme
        // word stays.
        s(
            "token",
            g(1),
            r#"(?i)\b(?:proxy-)?authorization\\?["']?[ \t]*[:=][ \t]*\\?["']?(?:(?:bearer|basic|digest|token|negotiate|ntlm|apikey|sso-key)[ \t]+)?([^\s"',;\\]+)"#,
            secret_value,
        ),
        // key=value, key: value, "key": "value", \"key\": \"value\", ?key=value&.
        s(
            "secret",
            Take::KeyValue,
            r#"(?-u:\b)([A-Za-z0-9_.-]*(?i:pass|pwd|secret|token|key|credential|auth|sig)[A-Za-z0-9_.-]*)\\?["']?[ \t]*[=:]"#,
            always,
        ),
        // --name value, --name=value, -name value.
        s(
            "secret",
            Take::Flag,
            r#"(?:^|[\s"'(\[=,])(--?)([A-Za-z0-9_.-]*(?i:pass|pwd|secret|token|key|credential|auth|sig)[A-Za-z0-9_.-]*)"#,
            always,
        ),
        // mysql -pSECRET (a bare -p prompts; -P is the port).
        s(
            "secret",
            g(1),
            concat!(
                r#"(?:^|[\s/"'(])(?i:mysql|mysqldump|mysqladmin|mysqlimport|mysqlshow|mysqlcheck|mysqlbinlog|mysqlpump|mariadb|mariadb-dump|mariadb-admin)"#,
                command_args!(),
                "-p",
                arg_value!()
            ),
            secret_value,
        ),
        // sshpass -p SECRET, docker login -p SECRET, redis-cli -a SECRET.
        s(
            "secret",
            g(1),
            concat!(
                r#"(?:^|[\s/"'(])(?:sshpass|(?:docker|podman|nerdctl|buildah|skopeo)[ \t]+login)"#,
                command_args!(),
                r"-p(?:=|[ \t]*)",
                arg_value!()
            ),
            secret_value,
        ),
        s(
            "secret",
            g(1),
            concat!(
                r#"(?:^|[\s/"'(])redis-cli"#,
                command_args!(),
                r"-a[ \t]*",
                arg_value!()
            ),
            secret_value,
        ),
        // curl -u user:SECRET (the user stays).
        s(
            "secret",
            g(1),
            concat!(
                r#"(?:^|[\s/"'(])curl"#,
                command_args!(),
                r#"(?:-u[ \t]*|-U[ \t]*|--user[ \t=]+|--proxy-user[ \t=]+)["']?[^\s:"']*:([^\s"']+)"#
            ),
            secret_value,
        ),
        // wandb login KEY.
        s(
            "secret",
            g(1),
            concat!(
                r#"(?:^|[\s/"'(])wandb[ \t]+login"#,
                command_args!(),
                r"([A-Za-z0-9][A-Za-z0-9_-]{31,})"
            ),
            always,
        ),
        // .netrc: `machine h login u password SECRET`, or a `password SECRET` line.
        s(
            "secret",
            g(1),
            r"(?m)(?:\bmachine[ \t]+\S+[ \t]+login[ \t]+\S+[ \t]+|^[ \t]*)password[ \t]+(\S+)[ \t]*$",
            secret_value,
        ),
        s(
            "credentials",
            g(1),
            r"(?i)\b[a-z][a-z0-9+.-]*://([^/\s:@]*:[^/\s?#]+)@",
            always,
        ),
        s(
            "email",
            g(0),
            r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b",
            always,
        ),
        s(
            "blob",
            g(1),
            r"(?:^|[^A-Za-z0-9+/])([A-Za-z0-9+/]{40,}={0,2})",
            looks_like_base64_secret,
        ),
    ]
}

/// A `Bearer x` / `token x` value: long enough, and not an ordinary word.
fn looks_like_credential(s: &str) -> bool {
    s.bytes().any(|b| b.is_ascii_digit()) || s.len() >= 20
}

fn network_patterns() -> Vec<Pattern> {
    let p = |kind, group, source, accept| Pattern {
        kind,
        take: Take::Group(group),
        source,
        accept,
    };
    vec![
        p(
            Kind::Ipv4,
            0,
            r"\b(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\b",
            always,
        ),
        p(
            Kind::Ipv6,
            0,
            r"(?i)(?:\b(?:[0-9a-f]{1,4}:){7}[0-9a-f]{1,4}\b|\b(?:[0-9a-f]{1,4}:){1,6}(?::[0-9a-f]{1,4}){1,6}\b|::[0-9a-f]{1,4}(?::[0-9a-f]{1,4}){0,5}\b|\b(?:[0-9a-f]{1,4}:){1,7}:)",
            looks_like_ipv6,
        ),
        // NCCL's `host:pid:tid` prefix.
        p(
            Kind::HostInPrefix,
            1,
            r"(?:^|[\s\[])([A-Za-z][A-Za-z0-9.-]*[A-Za-z0-9]):[0-9]+:[0-9]+\b",
            plausible_host,
        ),
        // syslog: `Mon DD HH:MM:SS host ...`.
        p(
            Kind::HostInPrefix,
            1,
            r"^[A-Z][a-z]{2} [ 0-9][0-9] [0-9]{2}:[0-9]{2}:[0-9]{2} ([A-Za-z][A-Za-z0-9.-]*[A-Za-z0-9]) ",
            plausible_host,
        ),
        // hostname=x, host: x, node=x, nodename x.
        p(
            Kind::HostInPrefix,
            1,
            r#"(?i)\b(?:host_?name|host|node_?name|node)\s*[=:]\s*["']?([A-Za-z][A-Za-z0-9.-]*[A-Za-z0-9])"#,
            plausible_host,
        ),
        // Cluster-style names: dashed, ending in a number (`gpu-node-26`, `dgx-a100-017`).
        p(
            Kind::Fqdn,
            1,
            r"(?:^|[^/A-Za-z0-9_.-])([a-z][a-z0-9]*(?:-[a-z0-9]+)*-[0-9]{1,5})\b",
            dashed_host,
        ),
        p(
            Kind::Fqdn,
            0,
            r"(?i)\b(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+(?:com|net|org|io|ai|cloud|dev|edu|gov|local|localdomain|internal|lan|corp|cluster|svc|intra|private)\b",
            always,
        ),
    ]
}

/// A dashed name ending in a number that is not a well-known non-host word
/// (`utf-8`, `rank-3`, `step-100`, `cuda-12`, ...).
fn dashed_host(s: &str) -> bool {
    let first = s.split('-').next().unwrap_or("");
    !matches!(
        first,
        "utf"
            | "iso"
            | "sha"
            | "x86"
            | "rank"
            | "step"
            | "epoch"
            | "iter"
            | "cuda"
            | "cu"
            | "sm"
            | "run"
            | "py"
            | "python"
            | "nccl"
            | "torch"
            | "v"
            | "version"
            | "layer"
            | "block"
            | "shard"
            | "part"
            | "ckpt"
            | "checkpoint"
            | "batch"
            | "worker"
            | "job"
            | "local"
            | "world"
            | "pid"
            | "tid"
            | "thread"
            | "port"
            | "int"
            | "float"
            | "bf"
            | "fp"
            | "e"
            | "sec"
            | "ms"
    ) && plausible_host(s)
}

/// A captured host name that is a name, not a keyword or a number.
fn plausible_host(s: &str) -> bool {
    !matches!(
        s.to_ascii_lowercase().as_str(),
        "localhost" | "none" | "null" | "unknown" | "true" | "false"
    ) && s.len() >= 2
}

/// Cache of the lazy DFA that runs a pattern set, bytes at most (per thread, grown as
/// needed). With regex's default (2 MiB) the secret patterns together thrash it on
/// lines with secrets and every line falls back to the slow engine (2 MB/s instead of
/// 40); 3 MiB suffices today.
const SET_DFA_BYTES: usize = 8 << 20;

struct Compiled {
    set: RegexSet,
    res: Vec<Regex>,
    pats: Vec<Pattern>,
}

impl Compiled {
    fn new(all: Vec<Pattern>) -> Self {
        let (mut res, mut pats) = (Vec::new(), Vec::new());
        for p in all {
            if let Some(re) = compiled(p.source) {
                res.push(re);
                pats.push(p);
            }
        }
        let set = RegexSetBuilder::new(res.iter().map(Regex::as_str))
            .dfa_size_limit(SET_DFA_BYTES)
            .build()
            .unwrap_or_else(|e| {
                tracing::error!(error = %e, "redaction pattern set does not compile");
                RegexSet::empty()
            });
        Compiled { set, res, pats }
    }

    /// Every accepted span of every pattern the set finds in `text`.
    fn spans(&self, text: &str, out: &mut Vec<Span>) {
        for i in self.set.matches(text).iter() {
            let (re, pat) = (&self.res[i], &self.pats[i]);
            let mut at = 0;
            while let Some(caps) = re.captures_at(text, at) {
                let Some(whole) = caps.get(0) else {
                    break;
                };
                // Past this match (one byte on when it is empty), or past the value read.
                let next = whole.end().max(at + 1);
                let (found, resume) = match pat.take {
                    Take::Group(g) => (caps.get(g).map(|m| (m.start(), m.end())), next),
                    Take::KeyValue | Take::Flag => {
                        let read = match pat.take {
                            Take::KeyValue => key_value(text, &caps),
                            _ => flag_value(text, &caps),
                        };
                        read.map_or((None, next), |r| (r.secret, r.resume.max(next)))
                    }
                };
                if let Some((start, end)) = found
                    && start < end
                    && (pat.accept)(&text[start..end])
                {
                    out.push(Span {
                        start,
                        end,
                        kind: pat.kind,
                    });
                }
                if resume > text.len() {
                    break;
                }
                at = resume;
                while !text.is_char_boundary(at) {
                    at += 1;
                }
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Span {
    start: usize,
    end: usize,
    kind: Kind,
}

fn secrets() -> &'static Compiled {
    static C: OnceLock<Compiled> = OnceLock::new();
    C.get_or_init(|| Compiled::new(patterns()))
}

fn network() -> &'static Compiled {
    static C: OnceLock<Compiled> = OnceLock::new();
    C.get_or_init(|| Compiled::new(network_patterns()))
}

/// Keeps the earliest, then longest, of overlapping spans; `taken` spans win over all.
fn resolve(mut spans: Vec<Span>, taken: &[Span]) -> Vec<Span> {
    spans.sort_by(|a, b| a.start.cmp(&b.start).then(b.end.cmp(&a.end)));
    let mut out: Vec<Span> = Vec::with_capacity(spans.len());
    for s in spans {
        let overlaps_taken = taken.iter().any(|t| s.start < t.end && t.start < s.end);
        let overlaps_last = out.last().is_some_and(|l| s.start < l.end);
        if !overlaps_taken && !overlaps_last {
            out.push(s);
        }
    }
    out
}

/// Redacts log text. Cheap to clone; the patterns are compiled once per process.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Redactor {
    options: RedactOptions,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redactor")
            .field("options", &self.options)
            .finish()
    }
}

impl Redactor {
    /// A redactor with these host / address options.
    pub fn new(options: RedactOptions) -> Self {
        Redactor { options }
    }

    /// The options.
    pub fn options(&self) -> RedactOptions {
        self.options
    }

    /// One string, secrets only: host names and addresses are left as they are whatever
    /// the options say (use [`Redactor::redact_batch`] for those).
    pub fn redact_secrets(&self, text: &str) -> String {
        let mut spans = Vec::new();
        secrets().spans(text, &mut spans);
        let spans = resolve(spans, &[]);
        apply(text, &spans, None)
    }

    /// A batch of strings redacted together, so that a host name found in one line is
    /// also replaced in the others. `known_hosts` are names to replace wherever they
    /// occur (e.g. the nodes of the job). Pseudonyms are taken from and added to `map`.
    pub fn redact_batch<S: AsRef<str>>(
        &self,
        texts: &[S],
        known_hosts: &[String],
        map: &mut Pseudonyms,
    ) -> Vec<String> {
        let net_wanted = self.options.hosts || self.options.ips;
        // First: secrets and network spans of every line; collect host names.
        let mut per_line: Vec<(Vec<Span>, Vec<Span>)> = Vec::with_capacity(texts.len());
        let mut host_names: Vec<String> = Vec::new();
        if self.options.hosts {
            host_names.extend(known_hosts.iter().filter(|h| plausible_host(h)).cloned());
        }
        let mut secret_values: Vec<(String, &'static str)> = Vec::new();
        for t in texts {
            let t = t.as_ref();
            let mut s = Vec::new();
            secrets().spans(t, &mut s);
            let secret_spans = resolve(s, &[]);
            for sp in &secret_spans {
                let value =
                    t[sp.start..sp.end].trim_matches(|c| c == '"' || c == '\'' || c == '\\');
                if let (Kind::Secret(label), true) = (sp.kind, value.len() >= MIN_ECHOED_SECRET) {
                    secret_values.push((value.to_owned(), label));
                }
            }
            let mut n = Vec::new();
            if net_wanted {
                network().spans(t, &mut n);
                n.retain(|sp| match sp.kind {
                    Kind::Ipv4 | Kind::Ipv6 => self.options.ips,
                    _ => self.options.hosts,
                });
                if self.options.hosts {
                    for sp in &n {
                        if matches!(sp.kind, Kind::HostInPrefix | Kind::Fqdn) {
                            let name = &t[sp.start..sp.end];
                            // An address in a host position is an address.
                            if !is_ip(name) {
                                host_names.push(name.to_owned());
                            }
                        }
                    }
                }
            }
            per_line.push((secret_spans, n));
        }
        // Then: every occurrence of every host name found, in every line.
        host_names.sort_by_key(|h| std::cmp::Reverse(h.len()));
        host_names.dedup_by(|a, b| a.eq_ignore_ascii_case(b));
        let host_re = if host_names.is_empty() {
            None
        } else {
            let alt: Vec<String> = host_names.iter().map(|h| regex::escape(h)).collect();
            Regex::new(&format!(r"(?i)(?:^|\b)(?:{})(?:\b|$)", alt.join("|"))).ok()
        };
        let mut out = Vec::with_capacity(texts.len());
        // A secret found in one string is removed from all of them, wherever it is.
        secret_values.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
        secret_values.dedup_by(|a, b| a.0 == b.0);
        let echo_re = if secret_values.is_empty() {
            None
        } else {
            let alt: Vec<String> = secret_values
                .iter()
                .map(|(v, _)| regex::escape(v))
                .collect();
            Regex::new(&alt.join("|")).ok()
        };
        for (t, (secret_spans, mut net)) in texts.iter().zip(per_line) {
            let t = t.as_ref();
            let secret_spans = match &echo_re {
                Some(re) => {
                    let mut all = secret_spans.clone();
                    for m in re.find_iter(t) {
                        let label = secret_values
                            .iter()
                            .find(|(v, _)| v == m.as_str())
                            .map_or("secret", |(_, l)| *l);
                        all.push(Span {
                            start: m.start(),
                            end: m.end(),
                            kind: Kind::Secret(label),
                        });
                    }
                    resolve(all, &[])
                }
                None => secret_spans,
            };
            if let Some(re) = &host_re {
                net.retain(|s| matches!(s.kind, Kind::Ipv4 | Kind::Ipv6));
                for m in re.find_iter(t) {
                    // Part of a longer dotted or dashed name is not this host.
                    let before = t[..m.start()].chars().next_back();
                    let after = t[m.end()..].chars().next();
                    let glued = |c: Option<char>| {
                        matches!(c, Some('-' | '_')) || c.is_some_and(|c| c.is_ascii_alphanumeric())
                    };
                    if glued(before)
                        || glued(after)
                        || after == Some('.') && fqdn_continues(&t[m.end()..])
                    {
                        continue;
                    }
                    net.push(Span {
                        start: m.start(),
                        end: m.end(),
                        kind: Kind::Fqdn,
                    });
                }
            } else {
                net.retain(|s| matches!(s.kind, Kind::Ipv4 | Kind::Ipv6));
            }
            let net = resolve(net, &secret_spans);
            let mut all = secret_spans;
            all.extend(net);
            all.sort_by_key(|s| s.start);
            out.push(apply(t, &all, Some(map)));
        }
        out
    }
}

/// Whether what follows a `.` continues a dotted name (`.example.com`), as opposed to
/// ending a sentence.
fn fqdn_continues(rest: &str) -> bool {
    rest.chars()
        .nth(1)
        .is_some_and(|c| c.is_ascii_alphanumeric())
}

fn is_ip(s: &str) -> bool {
    s.parse::<std::net::IpAddr>().is_ok()
}

fn apply(text: &str, spans: &[Span], mut map: Option<&mut Pseudonyms>) -> String {
    if spans.is_empty() {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for s in spans {
        if s.start < at {
            continue;
        }
        out.push_str(&text[at..s.start]);
        let found = &text[s.start..s.end];
        match (s.kind, map.as_deref_mut()) {
            (Kind::Secret(label), _) => {
                out.push_str("[REDACTED:");
                out.push_str(label);
                out.push(']');
            }
            (Kind::Ipv4 | Kind::Ipv6, Some(m)) => out.push_str(&m.ip(found)),
            (Kind::HostInPrefix | Kind::Fqdn, Some(m)) => out.push_str(&m.host(found)),
            (_, None) => out.push_str(found),
        }
        at = s.end;
    }
    out.push_str(&text[at..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Secrets only: `input` must become `expect`.
    fn check(input: &str, expect: &str) {
        let got = Redactor::default().redact_secrets(input);
        assert_eq!(got, expect, "input: {input:?}");
    }

    #[test]
    fn secrets_are_removed() {
        let cases = [
            (
                "OPENAI_API_KEY=sk-proj-AbCdEf0123456789xyzXYZ rest",
                "OPENAI_API_KEY=[REDACTED:token] rest",
            ),
            (
                "using key sk-AbCdEf0123456789xyzXYZ now",
                "using key [REDACTED:token] now",
            ),
            (
                "clone with ghp_abcdefghijklmnopqrstuvwxyz0123456789",
                "clone with [REDACTED:token]",
            ),
            (
                "slack xoxb-123456789012-abcdefghijkl posted",
                "slack [REDACTED:token] posted",
            ),
            (
                "curl -H \"X-Auth: wdn_0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0\" ok",
                "curl -H \"X-Auth: [REDACTED:token]\" ok",
            ),
            (
                "aws id AKIAIOSFODNN7EXAMPLE in env",
                "aws id [REDACTED:aws-key] in env",
            ),
            (
                "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                "aws_secret_access_key = [REDACTED:secret]",
            ),
            (
                "auth eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.dBjftJeZ4CVPmB92K27uhbUJU1p1r_wW1gFWFOEjXk ok",
                "auth [REDACTED:jwt] ok",
            ),
            (
                "Authorization: Bearer abc123def456ghi789",
                "Authorization: Bearer [REDACTED:token]",
            ),
            (
                "db password=hunter2 retry",
                "db password=[REDACTED:secret] retry",
            ),
            (
                "PGPASSWORD=s3cr3t psql -h db",
                "PGPASSWORD=[REDACTED:secret] psql -h db",
            ),
            (
                "mysql --password hunter2 -u root",
                "mysql --password [REDACTED:secret] -u root",
            ),
            (
                r#"{"passwd": "x y z", "n": 1}"#,
                r#"{"passwd": [REDACTED:secret], "n": 1}"#,
            ),
            (
                "GET /v1/files?access_token=9f86d081884c7d659a2feaa0c55ad015&page=2",
                "GET /v1/files?access_token=[REDACTED:secret]&page=2",
            ),
            (
                "fetching s3://bob:pa55w0rd@bucket.example/ckpt",
                "fetching s3://[REDACTED:credentials]@bucket.example/ckpt",
            ),
            (
                "mail alice.smith+ops@example.co.uk on failure",
                "mail [REDACTED:email] on failure",
            ),
            (
                "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY----- after",
                "[REDACTED:private-key] after",
            ),
            (
                "-----BEGIN OPENSSH PRIVATE KEY----- b3BlbnNzaC1rZXktdjE",
                "[REDACTED:private-key]",
            ),
            (
                "MIIEowIBAAKCAQEAx4UbaDzY2Tj0wJ8Pq3vK7mZpL1oR9sN5cT6bF2hG8dW0eQyV",
                "[REDACTED:blob]",
            ),
        ];
        for (input, expect) in cases {
            check(input, expect);
        }
    }

    #[test]
    fn diagnostic_text_that_is_not_secret_survives() {
        let keep = [
            "[rank7]:[E ProcessGroupNCCL.cpp:616] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1234, OpType=ALLREDUCE, NumelIn=1, Timeout(ms)=600000)",
            "NCCL INFO comm 0x7f3a9c000000 rank 3 nRanks 16 nNodes 2 localRanks 8 localRank 3 commHash 0x7f3a9b2c1d4e5f60 - Init COMPLETE",
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
            "busId 0000:3b:00.0 uuid GPU-5f3e7c1a-2b4d-4e6f-8a9b-0c1d2e3f4a5b",
            "RuntimeError: CUDA error: an illegal memory access was encountered (cudaErrorIllegalAddress)",
            "step 12000 loss nan grad_norm inf lr 3.0e-4 max_tokens=4096 num_tokens: 512",
            "NCCL version 2.18.3+cuda12.1 local_rank=3 world_size=16",
            "saving /ckpt/run-42/step_001000/model_states.pt (commit 3f786850e387550fdab836ed7e6dc881de23001b)",
            "c10::Error at::cuda::blas::gemm 2024-05-01T12:00:00.123Z",
            "tokenizer.json loaded; token ids 101 102; pad_token_id 0",
            "/usr/lib/python3/dist-packages/torch/distributed/elastic/multiprocessing/api.py line 42",
        ];
        for line in keep {
            check(line, line);
        }
    }

    /// Invariant: a key or flag name is a secret's by its word parts (split at `_`, `-`,
    /// `.` and camelCase humps), so `db-password` and `apiKey` are, and `monkey`,
    /// `keyboard`, `tokenizer` and `num_key_value_heads` are not.
    #[test]
    fn secret_names_are_recognised_by_word_part() {
        let secret = [
            "password",
            "db-password",
            "db_password",
            "DB_PASSWORD",
            "PGPASSWORD",
            "dbPassword",
            "passwd",
            "MYSQL_PWD",
            "pwd",
            "pass",
            "SMTP_PASS",
            "passphrase",
            "secret",
            "client_secret",
            "secretKey",
            "AWS_SECRET_ACCESS_KEY",
            "SecretAccessKey",
            "token",
            "hub_token",
            "HF_TOKEN",
            "authToken",
            "HFTOKEN",
            "x-auth-token",
            "SessionToken",
            "key",
            "api_key",
            "apiKey",
            "APIKey",
            "api-key",
            "apikey",
            "access-key",
            "ssh-key",
            "x-api-key",
            "credential",
            "credentials",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "X-Amz-Credential",
            "auth",
            "basic_auth",
            "sig",
            "X-Amz-Signature",
            "trustStorePassword",
            "srcstorepass",
            "keypass",
        ];
        let not_secret = [
            "monkey",
            "keyboard",
            "KeyboardInterrupt",
            "KeyError",
            "tokenizer",
            "tokens",
            "tokens_per_second",
            "max_tokens",
            "num_key_value_heads",
            "query_key_value",
            "key_value",
            "eos_token",
            "pad_token",
            "pad_token_id",
            "sort_key",
            "text_key",
            "password_file",
            "password-stdin",
            "secretName",
            "secretKeyRef",
            "credential.helper",
            "AWS_SHARED_CREDENTIALS_FILE",
            "auth_type",
            "authentication",
            "Authorization",
            "SSH_AUTH_SOCK",
            "bypass",
            "passthrough",
            "signature",
            "StrictHostKeyChecking",
            "access_key_id",
            "TOKENIZERS_PARALLELISM",
            "master_port",
        ];
        for name in secret {
            assert!(secret_name(name).is_some(), "{name} names a secret");
        }
        for name in not_secret {
            assert_eq!(secret_name(name), None, "{name} does not name a secret");
        }
        assert_eq!(
            name_parts("APIKey2_x-amz.Signature"),
            ["api", "key", "x", "amz", "signature"]
        );
        // A small number is not a token; a path is not the working directory's secret.
        assert!(!secret_pair("max_token", "512"));
        assert!(secret_pair("pwd", "123456"));
        assert!(!secret_pair("PWD", "/workspace"));
        assert!(secret_pair("PWD", "hunter2"));
        assert!(!secret_pair("password", "${DB_PASSWORD}"));
        assert!(!secret_pair("password", "********"));
    }

    /// Invariant: redaction is linear in the line's length whatever the line repeats
    /// (each value is read once and at most [`MAX_VALUE_BYTES`] ahead before it is
    /// judged); a secret longer than that is still removed whole.
    #[test]
    fn repeated_keys_and_flags_are_read_once_and_long_secrets_go_whole() {
        let long = format!("password={} tail", "x".repeat(3 * MAX_VALUE_BYTES));
        assert_eq!(
            Redactor::default().redact_secrets(&long),
            "password=[REDACTED:secret] tail"
        );
        // Each of these once took quadratic time (a value read to the line's end for
        // every key); now each is a single pass over about 1 MB.
        for unit in [
            "password=",
            "--token ",
            "x-api-key: ",
            "\"password\": \"\\",
            "--token -(",
        ] {
            let line = unit.repeat(1_000_000 / unit.len());
            let out = Redactor::default().redact_secrets(&line);
            assert!(out.len() <= line.len() * 2, "{unit:?}");
        }
    }

    fn batch(opts: RedactOptions, lines: &[&str], known: &[&str]) -> (Vec<String>, Pseudonyms) {
        let mut map = Pseudonyms::new();
        let known: Vec<String> = known.iter().map(|s| (*s).to_owned()).collect();
        let out = Redactor::new(opts).redact_batch(lines, &known, &mut map);
        (out, map)
    }

    #[test]
    fn hosts_and_ips_are_kept_unless_asked() {
        let lines = ["gpu-node-26:1234:1290 [3] NCCL WARN connect to 10.0.0.7:29500 failed"];
        let (out, map) = batch(RedactOptions::default(), &lines, &["gpu-node-26"]);
        assert_eq!(out[0], lines[0]);
        assert!(map.is_empty());
    }

    #[test]
    fn hosts_and_ips_get_consistent_pseudonyms_that_reveal_back() {
        let opts = RedactOptions {
            hosts: true,
            ips: true,
        };
        let lines = [
            "gpu-node-26:1234:1290 [3] NCCL WARN connect to 10.0.0.7:29500 failed",
            "Jan  5 12:00:01 gpu-node-27 kernel: NVRM: Xid (PCI:0000:3b:00): 79",
            "rank 12 on GPU-NODE-26 waits for gpu-node-27 (10.0.0.7, fe80::1ff:fe23:4567:890a)",
            "master at head.cluster.example.com:29400 node=gpu-node-3",
            "unrelated: gpu-node-26x or gpu-node-26-ib or c10::add or 2.18.3",
        ];
        let (out, map) = batch(opts, &lines, &[]);
        assert_eq!(
            out[0],
            "host-1:1234:1290 [3] NCCL WARN connect to ip-1:29500 failed"
        );
        assert_eq!(
            out[1],
            "Jan  5 12:00:01 host-2 kernel: NVRM: Xid (PCI:0000:3b:00): 79"
        );
        assert_eq!(out[2], "rank 12 on host-1 waits for host-2 (ip-1, ip-2)");
        assert_eq!(out[3], "master at host-3:29400 node=host-4");
        assert_eq!(
            out[4],
            "unrelated: gpu-node-26x or gpu-node-26-ib or c10::add or 2.18.3"
        );
        assert_eq!(map.real("host-1"), Some("gpu-node-26"));
        assert_eq!(
            map.reveal("rank 12 on host-2 (ip-1); host-99 unknown"),
            "rank 12 on gpu-node-27 (10.0.0.7); host-99 unknown"
        );
    }

    #[test]
    fn dashed_names_ending_in_a_number_are_hosts_but_common_words_are_not() {
        let opts = RedactOptions {
            hosts: true,
            ips: false,
        };
        let (out, _) = batch(
            opts,
            &[
                "peers gpu-node-1 gpu-node-2, dgx-a100-017; utf-8 rank-3 /ckpt/run-42/x cuda-12 worker-3",
            ],
            &[],
        );
        assert_eq!(
            out[0],
            "peers host-1 host-2, host-3; utf-8 rank-3 /ckpt/run-42/x cuda-12 worker-3"
        );
    }

    #[test]
    fn known_hosts_are_replaced_everywhere() {
        let opts = RedactOptions {
            hosts: true,
            ips: false,
        };
        let (out, _) = batch(opts, &["trainer on dgx017 died", "dgx017."], &["dgx017"]);
        assert_eq!(out, ["trainer on host-1 died", "host-1."]);
    }

    #[test]
    fn a_secret_found_once_is_removed_everywhere_in_the_batch() {
        let (out, _) = batch(
            RedactOptions::default(),
            &[
                "login password=hunter2-horse",
                "the password was hunter2-horse, sadly",
                "pwd=abc",
            ],
            &[],
        );
        assert_eq!(
            out,
            [
                "login password=[REDACTED:secret]",
                "the password was [REDACTED:secret], sadly",
                "pwd=[REDACTED:secret]"
            ]
        );
    }

    #[test]
    fn secrets_win_over_hosts() {
        let opts = RedactOptions {
            hosts: true,
            ips: true,
        };
        let (out, _) = batch(opts, &["mail ops@gpu.example.com token=abc123def"], &[]);
        assert_eq!(out[0], "mail [REDACTED:email] token=[REDACTED:secret]");
    }
}
