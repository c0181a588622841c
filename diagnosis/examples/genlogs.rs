//! Writes a generated multi-rank training log to a file (see `warden_diagnosis::loggen`).
//!
//! `cargo run --release -p warden-diagnosis --example genlogs -- OUT [--bytes N]
//! [--lines N] [--seed N] [--nodes N] [--gpus N] [--no-failure]`
//!
//! Prints the summary (ground truth of the injected failure) as JSON on stdout.

use std::fs::File;
use std::process::ExitCode;

use warden_diagnosis::loggen::{GenConfig, write_log};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("genlogs: {e}");
            ExitCode::from(64)
        }
    }
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let mut out: Option<String> = None;
    let mut cfg = GenConfig::default();
    while let Some(arg) = args.next() {
        let mut num = |name: &str| -> Result<u64, String> {
            let v = args.next().ok_or(format!("{name} needs a value"))?;
            v.replace('_', "")
                .parse::<u64>()
                .map_err(|e| format!("{name} {v:?}: {e}"))
        };
        match arg.as_str() {
            "--bytes" => cfg.target_bytes = num("--bytes")?,
            "--lines" => cfg.max_lines = num("--lines")?,
            "--seed" => cfg.seed = num("--seed")?,
            "--nodes" => cfg.nodes = u32::try_from(num("--nodes")?).map_err(|e| e.to_string())?,
            "--gpus" => {
                cfg.gpus_per_node = u32::try_from(num("--gpus")?).map_err(|e| e.to_string())?
            }
            "--no-failure" => cfg.inject_failure = false,
            s if s.starts_with("--") => return Err(format!("unknown flag {s}")),
            s => out = Some(s.to_owned()),
        }
    }
    let path = out.ok_or("usage: genlogs OUT [--bytes N] [--lines N] [--seed N] [--nodes N] [--gpus N] [--no-failure]")?;
    let file = File::create(&path).map_err(|e| format!("{path}: {e}"))?;
    let s = write_log(&cfg, file).map_err(|e| format!("{path}: {e}"))?;
    let fault_lines: Vec<String> = s.fault_lines.iter().map(u64::to_string).collect();
    println!(
        "{{\"path\": {path:?}, \"lines\": {}, \"bytes\": {}, \"world_size\": {}, \"culprit_rank\": {}, \"culprit_node\": {:?}, \"onset_line\": {}, \"fault_lines\": [{}]}}",
        s.lines,
        s.bytes,
        s.world_size,
        s.culprit_rank.map_or("null".to_owned(), |r| r.to_string()),
        s.culprit_node.unwrap_or_default(),
        s.onset_line.map_or("null".to_owned(), |r| r.to_string()),
        fault_lines.join(", ")
    );
    Ok(())
}
