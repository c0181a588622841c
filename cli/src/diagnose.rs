//! `warden diagnose`: classify a failure from log files (or stdin) with the log rules and
//! print the category, locus, culprit, evidence and explanation; `--eval` scores the
//! rules on a labelled corpus instead.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use warden_diagnosis::Diagnosis;
use warden_diagnosis::classify::Classifier;
use warden_diagnosis::eval::{Evaluation, evaluate, parse_corpus};
use warden_diagnosis::input::{InputError, InputStats, LineReader, for_each_line};
use warden_diagnosis::rules::RuleSet;

use crate::{DiagnoseArgs, EXIT_CONFIG};

/// Exit code of input that is not a usable log or corpus (EX_DATAERR in sysexits.h).
pub const EXIT_DATA: u8 = 65;
/// Exit code of an input file that cannot be opened (EX_NOINPUT in sysexits.h).
pub const EXIT_NO_INPUT: u8 = 66;

const READ_BUFFER_BYTES: usize = 256 * 1024;

/// Why `warden diagnose` stops before answering: a message and its exit code.
#[derive(Debug)]
struct Refusal {
    code: u8,
    message: String,
}

impl Refusal {
    fn new(code: u8, message: impl Into<String>) -> Self {
        Refusal {
            code,
            message: message.into(),
        }
    }
}

/// What the rules made of the input.
#[derive(Debug)]
struct RulesOutcome {
    diagnosis: Diagnosis,
    stats: InputStats,
}

/// Run `warden diagnose`.
pub fn main(args: &DiagnoseArgs) -> anyhow::Result<ExitCode> {
    match run(args) {
        Ok(code) => Ok(code),
        Err(refusal) => {
            eprintln!("warden diagnose: {}", refusal.message);
            Ok(ExitCode::from(refusal.code))
        }
    }
}

fn run(args: &DiagnoseArgs) -> Result<ExitCode, Refusal> {
    let rules = match &args.rules {
        Some(dir) => RuleSet::builtin_with_dir(dir),
        None => RuleSet::builtin(),
    }
    .map_err(|e| Refusal::new(EXIT_CONFIG, e.to_string()))?;

    if let Some(corpus) = &args.eval {
        let evaluation = run_eval(&rules, corpus)?;
        print_eval(&evaluation, args.json).or_else(quiet_broken_pipe)?;
        return Ok(ExitCode::SUCCESS);
    }

    let outcome = classify_inputs(&rules, &args.files)?;
    warn_about_input(&outcome.stats);
    // The rules' answer is final here; a refinement step would take `outcome` (the
    // answer and its evidence) and return the diagnosis to print.
    print_diagnosis(&outcome.diagnosis, &outcome.stats, args.json).or_else(quiet_broken_pipe)?;
    Ok(ExitCode::SUCCESS)
}

/// A reader that stopped reading (`| head`) is not an error.
fn quiet_broken_pipe(e: anyhow::Error) -> Result<(), Refusal> {
    let broken = e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .map(std::io::Error::kind)
            .or_else(|| {
                cause
                    .downcast_ref::<serde_json::Error>()
                    .and_then(serde_json::Error::io_error_kind)
            })
            == Some(std::io::ErrorKind::BrokenPipe)
    });
    if broken {
        Ok(())
    } else {
        Err(Refusal::new(1, format!("{e:#}")))
    }
}

fn classify_inputs(rules: &RuleSet, files: &[PathBuf]) -> Result<RulesOutcome, Refusal> {
    let mut classifier = Classifier::new(rules);
    let mut stats = InputStats::default();
    let stdin_only = files.is_empty();
    let sources: Vec<Option<&Path>> = if stdin_only {
        vec![None]
    } else {
        files
            .iter()
            .map(|f| (f.as_os_str() != "-").then_some(f.as_path()))
            .collect()
    };
    for source in sources {
        let name = source.map_or_else(|| "stdin".to_owned(), |p| p.display().to_string());
        let reader: Box<dyn BufRead> = match source {
            None => Box::new(BufReader::with_capacity(
                READ_BUFFER_BYTES,
                std::io::stdin().lock(),
            )),
            Some(path) => {
                if path.is_dir() {
                    return Err(Refusal::new(
                        EXIT_NO_INPUT,
                        format!("{name} is a directory, not a log file"),
                    ));
                }
                let file = File::open(path)
                    .map_err(|e| Refusal::new(EXIT_NO_INPUT, format!("cannot open {name}: {e}")))?;
                Box::new(BufReader::with_capacity(READ_BUFFER_BYTES, file))
            }
        };
        let mut lines = LineReader::starting_at(reader, classifier.lines());
        for_each_line(&mut lines, |line| classifier.push(line)).map_err(|e| match e {
            InputError::Binary { .. } => Refusal::new(EXIT_DATA, format!("{name}: {e}")),
            InputError::Io(_) => Refusal::new(EXIT_NO_INPUT, format!("{name}: {e}")),
        })?;
        if lines.stats().lines == 0 && !stdin_only {
            eprintln!("warden diagnose: warning: {name} is empty");
        }
        stats.add(lines.stats());
    }
    if stats.lines == 0 {
        let what = if stdin_only {
            "stdin".to_owned()
        } else {
            "the input".to_owned()
        };
        return Err(Refusal::new(
            EXIT_DATA,
            format!("{what} is empty: there are no log lines to diagnose"),
        ));
    }
    Ok(RulesOutcome {
        diagnosis: classifier.diagnosis(),
        stats,
    })
}

fn warn_about_input(stats: &InputStats) {
    if stats.truncated_lines > 0 {
        eprintln!(
            "warden diagnose: warning: {} line(s) longer than {} KiB were cut",
            stats.truncated_lines,
            warden_diagnosis::input::MAX_LINE_BYTES / 1024
        );
    }
    if stats.invalid_utf8_lines > 0 {
        eprintln!(
            "warden diagnose: warning: {} line(s) had invalid UTF-8 (replaced with U+FFFD)",
            stats.invalid_utf8_lines
        );
    }
    if stats.nul_bytes > 0 {
        eprintln!(
            "warden diagnose: warning: {} NUL byte(s) dropped",
            stats.nul_bytes
        );
    }
}

fn print_diagnosis(d: &Diagnosis, stats: &InputStats, json: bool) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut out, d).context("encoding the diagnosis")?;
        writeln!(out)?;
        return Ok(());
    }
    let category = d.category.map_or("unknown", |c| c.as_str());
    writeln!(out, "Category:    {category}")?;
    writeln!(
        out,
        "Fault locus: {}",
        d.fault_locus.map_or("unknown", |l| l.as_str())
    )?;
    writeln!(out, "Culprit:     {}", d.culprit.text)?;
    writeln!(out, "Confidence:  {:.2}", d.confidence)?;
    if let Some(action) = &d.recommended_action {
        writeln!(out, "Recommended: {action}")?;
    }
    if !d.evidence.is_empty() {
        writeln!(out, "Evidence:")?;
        for e in &d.evidence {
            writeln!(
                out,
                "  line {:<6} {:<34} {}",
                e.id,
                e.rule_id.as_deref().unwrap_or(&e.reason),
                e.text
            )?;
        }
    }
    writeln!(out, "Explanation: {}", d.explanation)?;
    writeln!(out, "({} line(s) read, {} bytes)", stats.lines, stats.bytes)?;
    Ok(())
}

fn run_eval(rules: &RuleSet, corpus: &Path) -> Result<Evaluation, Refusal> {
    let name = corpus.display();
    let bytes = std::fs::read(corpus)
        .map_err(|e| Refusal::new(EXIT_NO_INPUT, format!("cannot read {name}: {e}")))?;
    let text = String::from_utf8(bytes)
        .map_err(|e| Refusal::new(EXIT_DATA, format!("{name} is not UTF-8: {e}")))?;
    let cases = parse_corpus(&text).map_err(|e| Refusal::new(EXIT_DATA, format!("{name}: {e}")))?;
    evaluate(rules, &cases).map_err(|e| Refusal::new(1, e.to_string()))
}

fn print_eval(e: &Evaluation, json: bool) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        let confusion: Vec<serde_json::Value> = e
            .confusion()
            .into_iter()
            .map(|((label, answer), count)| {
                serde_json::json!({"label": label, "answer": answer, "count": count})
            })
            .collect();
        let value = serde_json::json!({
            "category_accuracy": e.category_accuracy(),
            "fault_locus_accuracy": e.locus_accuracy(),
            "culprit_accuracy": e.culprit_accuracy(),
            "evaluation": e,
            "confusion": confusion,
        });
        serde_json::to_writer_pretty(&mut out, &value).context("encoding the evaluation")?;
        writeln!(out)?;
    } else {
        write!(out, "{}", e.to_markdown())?;
    }
    Ok(())
}
