//! Prints every regex of the shipped (enabled) log rules, one a line, as compiled:
//! placeholders expanded. For `rg -f` and other tools that take a pattern file.
//!
//! `cargo run --release -p warden-diagnosis --example export-patterns > patterns.txt`
//! (`-- --needles`: the prefilter's literal needles instead).

use std::io::Write;
use std::process::ExitCode;

use warden_diagnosis::rules::RuleSet;

fn main() -> ExitCode {
    let rules = match RuleSet::builtin() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("export-patterns: {e}");
            return ExitCode::FAILURE;
        }
    };
    let needles = std::env::args().nth(1).as_deref() == Some("--needles");
    let mut out = std::io::stdout().lock();
    for rule in rules.rules() {
        let items: Vec<&str> = if needles {
            rule.needles().iter().map(String::as_str).collect()
        } else {
            rule.patterns().collect()
        };
        for pattern in items {
            if writeln!(out, "{pattern}").is_err() {
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
