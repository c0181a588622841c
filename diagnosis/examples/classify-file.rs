//! Runs the rule classifier over a log file and reports its throughput: every line is
//! scanned by the rule engine (needle prefilter, then the regexes with captures), as
//! `warden diagnose` does, and the answer is printed.
//!
//! `cargo run --release -p warden-diagnosis --example classify-file -- FILE [--line-reader]`
//!
//! By default the file is read in 1 MiB blocks and split at `\n` with memchr, one
//! reused `LogLine` per line (invalid UTF-8 replaced); `--line-reader` reads through
//! `input::LineReader` instead, as the CLI does. Prints a `RESULT key=value ...` line.

use std::fs::File;
use std::io::{BufReader, Read};
use std::process::ExitCode;
use std::time::Instant;

use warden_diagnosis::classify::Classifier;
use warden_diagnosis::input::{LineReader, for_each_line};
use warden_diagnosis::model::LogLine;
use warden_diagnosis::rules::RuleSet;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("classify-file: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let mut path = None;
    let mut line_reader = false;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--line-reader" => line_reader = true,
            s if s.starts_with("--") => return Err(format!("unknown flag {s}")),
            s => path = Some(s.to_owned()),
        }
    }
    let path = path.ok_or("usage: classify-file FILE [--line-reader]")?;
    let rules = RuleSet::builtin().map_err(|e| e.to_string())?;
    let mut classifier = Classifier::new(&rules);
    let file = File::open(&path).map_err(|e| format!("{path}: {e}"))?;
    let start = Instant::now();
    let bytes = if line_reader {
        let mut reader = LineReader::new(BufReader::with_capacity(1 << 20, file));
        for_each_line(&mut reader, |line| classifier.push(line))
            .map_err(|e| format!("{path}: {e}"))?;
        reader.stats().bytes
    } else {
        blocks(file, &mut classifier).map_err(|e| format!("{path}: {e}"))?
    };
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    let lines = classifier.lines();
    let hits = classifier.hits().count();
    let d = classifier.diagnosis();
    println!(
        "rules: {lines} lines, {:.1} MiB in {secs:.2} s: {:.0} lines/s, {:.1} MiB/s; {hits} hits kept; answer {} ({})",
        bytes as f64 / (1 << 20) as f64,
        lines as f64 / secs,
        bytes as f64 / (1 << 20) as f64 / secs,
        d.category.map_or("unknown", |c| c.as_str()),
        d.rule_ids.first().map_or("", String::as_str),
    );
    println!(
        "RESULT impl=warden-rules lines={lines} bytes={bytes} secs={secs:.4} mib_per_sec={:.1} category={}",
        bytes as f64 / (1 << 20) as f64 / secs,
        d.category.map_or("unknown", |c| c.as_str()),
    );
    Ok(())
}

/// Feeds every line of `file` to the classifier, reading 1 MiB blocks; returns bytes read.
fn blocks(mut file: File, classifier: &mut Classifier<'_>) -> std::io::Result<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let mut have = 0usize;
    let mut total = 0u64;
    let mut line = LogLine::default();
    let mut push = |text: &[u8], classifier: &mut Classifier<'_>| {
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        line.text.clear();
        match std::str::from_utf8(text) {
            Ok(t) => line.text.push_str(t),
            Err(_) => line.text.push_str(&String::from_utf8_lossy(text)),
        }
        classifier.push(&line);
        line.id += 1;
    };
    loop {
        if have == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        let n = file.read(&mut buf[have..])?;
        total += n as u64;
        if n == 0 {
            if have > 0 {
                push(&buf[..have], classifier);
            }
            return Ok(total);
        }
        have += n;
        let mut start = 0;
        for nl in memchr::memchr_iter(b'\n', &buf[start..have]) {
            push(&buf[start..nl], classifier);
            start = nl + 1;
        }
        buf.copy_within(start..have, 0);
        have -= start;
    }
}
