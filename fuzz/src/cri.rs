//! Fuzz target: the training-log tailer on Kubernetes CRI container logs
//! (`warden_agent::logs::{tail, cri, multiline, attribution}`).
//!
//! The input, after two knob bytes, is written to a file under a `/var/log/pods/...`
//! layout in two pieces, with a `Tailer` poll after each, one after the partial-line
//! idle time and a final flush, so CRI records and their `P`/`F` pieces, plain lines,
//! tracebacks and partial lines all meet the real framing code. Each line is also
//! given to `cri::parse_record`, `cri::parse_rfc3339_ns` and `cri::parse_pod_log_path`.
//! Checked: nothing panics; a single-line record never holds more than
//! `max_line_bytes` of what was read, a grouped one is never longer than
//! `multiline.max_bytes` or `multiline.max_lines`; a CRI record's content is the end of
//! its line.

use std::io::Write;
use std::path::PathBuf;
use std::sync::OnceLock;

use warden_agent::logs::config::MultilineConfig;
use warden_agent::logs::cri;
use warden_agent::logs::{Format, LogLine, SourceConfig, StartAt, TailConfig, Tailer};

const T0: i64 = 1_700_000_000_000_000_000;
const SEC: i64 = 1_000_000_000;

/// This process's container log file (the directory is made once).
fn log_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = std::env::temp_dir()
            .join(format!("warden-fuzz-cri-{}", std::process::id()))
            .join("var/log/pods/team_trainer-3_0f1e2d3c/pytorch");
        std::fs::create_dir_all(&dir).expect("make the scratch log directory");
        dir.join("0.log")
    })
}

/// One input, as libFuzzer passes it (`fuzz_targets/cri.rs`).
pub fn run(input: &[u8]) {
    let [k1, k2, data @ ..] = input else {
        return;
    };
    let max_line = [64, 100, 512, 4096][usize::from(k1 & 3)];
    let format = [Format::Cri, Format::Auto, Format::Plain, Format::Cri][usize::from(k1 >> 2 & 3)];
    let multiline = MultilineConfig {
        enabled: k1 & 0x10 == 0,
        max_lines: 2 + u32::from(k1 >> 5),
        max_bytes: max_line * (1 + usize::from(k1 >> 6)),
        flush_ms: 1_000,
    };
    let split = data.len() * usize::from(*k2) / 255;

    let path = log_path();
    std::fs::write(path, &data[..split]).expect("write the log");
    let cfg = TailConfig {
        sources: vec![SourceConfig {
            format,
            ranks_per_pod: Some(8),
            ..SourceConfig::new([path.to_string_lossy().into_owned()])
        }],
        max_line_bytes: max_line,
        start_at: StartAt::Beginning,
        multiline: multiline.clone(),
        ..TailConfig::default()
    };
    let mut tailer = Tailer::new(cfg).expect("a valid tailer config");
    let mut lines: Vec<LogLine> = Vec::new();
    tailer.poll(T0, &mut lines);
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(&data[split..]))
        .expect("append to the log");
    tailer.poll(T0 + SEC / 10, &mut lines);
    tailer.poll(T0 + 10 * SEC, &mut lines);
    tailer.flush(T0 + 11 * SEC, &mut |l| lines.push(l));

    for l in &lines {
        if l.lines <= 1 {
            // Invalid UTF-8 is replaced by U+FFFD (3 bytes for at least 1 read): the
            // bytes read for the line are at least this many.
            let read = l.text.len() - 2 * l.text.matches('\u{FFFD}').count();
            assert!(
                read <= max_line,
                "a {read}-byte line passed max_line_bytes {max_line}: {:?}",
                l.text
            );
        } else {
            assert!(multiline.enabled, "no grouping when it is off");
            assert!(
                l.text.len() <= multiline.max_bytes,
                "a {}-byte record passed multiline.max_bytes {}",
                l.text.len(),
                multiline.max_bytes
            );
            assert!(l.lines <= multiline.max_lines);
        }
        assert!(!l.text.contains('\0'), "NUL bytes are dropped");
    }

    for line in data.split(|&b| b == b'\n') {
        if let Some(rec) = cri::parse_record(line) {
            assert!(line.ends_with(rec.content));
            assert!(cri::looks_like_record(line));
        }
        let _ = cri::parse_rfc3339_ns(line);
        if let Ok(text) = std::str::from_utf8(line) {
            let _ = cri::parse_pod_log_path(text);
        }
    }
}
