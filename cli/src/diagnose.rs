//! `warden diagnose`: diagnose a failure from log files (or stdin) with the deterministic
//! pipeline (log rules, template mining, watchdog analysis), optionally refined by a
//! model behind an OpenAI-compatible API, and print the category, locus, culprit,
//! evidence and explanation; `--eval` scores the rules (and the model) on a labelled
//! corpus instead.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use warden_diagnosis::eval::{Case, Evaluation, duplicate_id, evaluate_with, parse_corpus};
use warden_diagnosis::input::{InputError, InputStats, LineReader, for_each_line};
use warden_diagnosis::llm::{LlmConfig, LlmDiagnoser, Outcome};
use warden_diagnosis::llm_eval::{EvalCase, EvalReport, evaluate_corpus};
use warden_diagnosis::rules::RuleSet;
use warden_diagnosis::{Diagnosis, EvidenceLine, Pipeline, PipelineOptions, diagnose_lines};

use crate::output::{self, Output};
use crate::{DiagnoseArgs, EXIT_USAGE};

use crate::client::{EXIT_DATA, EXIT_NOT_FOUND};

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
    .map_err(|e| Refusal::new(EXIT_USAGE, e.to_string()))?;
    // A bad model configuration is refused before any input is read.
    let llm = llm_client(args)?;

    if !args.eval.is_empty() {
        let mut cases = Vec::new();
        for corpus in &args.eval {
            cases.extend(read_corpora(corpus)?);
        }
        if let Some(dup) = duplicate_id(&cases) {
            return Err(Refusal::new(
                EXIT_DATA,
                format!("case id {dup:?} appears twice in the corpus"),
            ));
        }
        match &llm {
            None => {
                let evaluation = run_eval(&rules, &cases)?;
                print_eval(&evaluation, args.output()).or_else(quiet_broken_pipe)?;
            }
            Some(llm) => {
                let report = run_llm_eval(&rules, &cases, llm)?;
                print_llm_eval(&report, &llm.config().model, args.output())
                    .or_else(quiet_broken_pipe)?;
            }
        }
        return Ok(ExitCode::SUCCESS);
    }

    let outcome = diagnose_inputs(&rules, &args.files)?;
    warn_about_input(&outcome.stats);
    let rules_answer = outcome.diagnosis;
    let answer = match &llm {
        None => rules_answer.clone(),
        Some(llm) => {
            let (answer, how) =
                runtime()?.block_on(llm.refine(&rules_answer, &rules_answer.evidence));
            report_outcome(&how);
            answer
        }
    };
    print_diagnosis(&answer, &rules_answer, &outcome.stats, args.output())
        .or_else(quiet_broken_pipe)?;
    Ok(ExitCode::SUCCESS)
}

/// The model client the flags ask for, if any; flags that do not fit together, a bad
/// URL or an unreadable key are refused with exit 2.
fn llm_client(args: &DiagnoseArgs) -> Result<Option<LlmDiagnoser>, Refusal> {
    let usage = |m: &str| Refusal::new(EXIT_USAGE, m.to_owned());
    let (url, model) = match (&args.llm_url, &args.llm_model) {
        (Some(url), Some(model)) => (url, model),
        (Some(_), None) => {
            return Err(usage(
                "--llm-url needs --llm-model (or WARDEN_LLM_MODEL): which model to ask",
            ));
        }
        (None, model) => {
            let given = model.is_some()
                || args.llm_key_file.is_some()
                || args.llm_key_env.is_some()
                || args.llm_timeout_secs.is_some();
            if given {
                return Err(usage(
                    "--llm-model, --llm-key-file, --llm-key-env and --llm-timeout-secs need \
                     --llm-url (or WARDEN_LLM_URL)",
                ));
            }
            return Ok(None);
        }
    };
    let mut config = LlmConfig::new(url.trim(), model.trim());
    config.api_key_file.clone_from(&args.llm_key_file);
    config.api_key_env.clone_from(&args.llm_key_env);
    if let Some(secs) = args.llm_timeout_secs {
        config.timeout_ms = secs.saturating_mul(1_000);
    }
    LlmDiagnoser::new(config)
        .map(Some)
        .map_err(|e| Refusal::new(EXIT_USAGE, format!("LLM configuration: {e}")))
}

/// A single-threaded runtime for the requests to the model.
fn runtime() -> Result<tokio::runtime::Runtime, Refusal> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Refusal::new(1, format!("cannot start the async runtime: {e}")))
}

/// Says on stderr when the model's answer was not used, and why.
fn report_outcome(outcome: &Outcome) {
    match outcome {
        Outcome::Fallback(e) => eprintln!(
            "warden diagnose: LLM not used ({}): {e}; printing the rules' answer",
            outcome.label()
        ),
        Outcome::Refined {
            dropped_culprits, ..
        } if !dropped_culprits.is_empty() => eprintln!(
            "warden diagnose: the model named culprits the evidence does not show, dropped: {}",
            dropped_culprits.join(", ")
        ),
        Outcome::Refined { .. } => {}
    }
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

fn diagnose_inputs(rules: &RuleSet, files: &[PathBuf]) -> Result<RulesOutcome, Refusal> {
    let mut pipeline = Pipeline::new(rules, PipelineOptions::default());
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
                        EXIT_NOT_FOUND,
                        format!("{name} is a directory, not a log file"),
                    ));
                }
                let file = File::open(path).map_err(|e| {
                    Refusal::new(EXIT_NOT_FOUND, format!("cannot open {name}: {e}"))
                })?;
                Box::new(BufReader::with_capacity(READ_BUFFER_BYTES, file))
            }
        };
        let mut lines = LineReader::starting_at(reader, pipeline.lines() + 1);
        for_each_line(&mut lines, |line| pipeline.push(line)).map_err(|e| match e {
            InputError::Binary { .. } => Refusal::new(EXIT_DATA, format!("{name}: {e}")),
            InputError::Io(_) => Refusal::new(EXIT_NOT_FOUND, format!("{name}: {e}")),
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
        diagnosis: pipeline.finish(),
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

/// Prints the answer; `rules` is the rules' own answer, shown beside a model's.
fn print_diagnosis(
    d: &Diagnosis,
    rules: &Diagnosis,
    stats: &InputStats,
    format: Output,
) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if format.is_document() {
        out.write_all(output::document(format, d)?.as_bytes())?;
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
    writeln!(out, "Confidence:  {:.0}%", d.confidence * 100.0)?;
    writeln!(out, "Source:      {}", d.source)?;
    if d.source != rules.source {
        writeln!(
            out,
            "Rules said:  {} ({}), culprit {}, confidence {:.2}",
            rules.category.map_or("unknown", |c| c.as_str()),
            rules.fault_locus.map_or("unknown", |l| l.as_str()),
            rules.culprit.text,
            rules.confidence
        )?;
    }
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

/// The cases of a corpus file, or of every `*.jsonl` file of a directory (in name order).
fn read_corpora(path: &Path) -> Result<Vec<Case>, Refusal> {
    if !path.is_dir() {
        return read_corpus(path);
    }
    let name = path.display();
    let entries = std::fs::read_dir(path)
        .map_err(|e| Refusal::new(EXIT_NOT_FOUND, format!("cannot read {name}: {e}")))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(Refusal::new(
            EXIT_DATA,
            format!("{name} holds no *.jsonl corpus file"),
        ));
    }
    let mut cases = Vec::new();
    for file in files {
        cases.extend(read_corpus(&file)?);
    }
    Ok(cases)
}

fn read_corpus(corpus: &Path) -> Result<Vec<Case>, Refusal> {
    let name = corpus.display();
    let bytes = std::fs::read(corpus)
        .map_err(|e| Refusal::new(EXIT_NOT_FOUND, format!("cannot read {name}: {e}")))?;
    let text = String::from_utf8(bytes)
        .map_err(|e| Refusal::new(EXIT_DATA, format!("{name} is not UTF-8: {e}")))?;
    parse_corpus(&text).map_err(|e| Refusal::new(EXIT_DATA, format!("{name}: {e}")))
}

/// Scores the deterministic pipeline (what `warden diagnose` prints) on the corpus.
fn run_eval(rules: &RuleSet, cases: &[Case]) -> Result<Evaluation, Refusal> {
    let opts = PipelineOptions::default();
    evaluate_with(cases, |lines| diagnose_lines(rules, lines, &opts))
        .map_err(|e| Refusal::new(1, e.to_string()))
}

/// The pipeline's answer and evidence for one excerpt.
fn pipeline_answer(rules: &RuleSet, excerpt: &str) -> (Diagnosis, Vec<EvidenceLine>) {
    let mut pipeline = Pipeline::new(rules, PipelineOptions::default());
    let mut reader = LineReader::new(excerpt.as_bytes());
    // An excerpt is text already; one that reads as binary is answered from the lines
    // read before the refusal.
    let _ = for_each_line(&mut reader, |line| pipeline.push(line));
    let answer = pipeline.finish();
    let evidence = answer.evidence.clone();
    (answer, evidence)
}

/// Asks the model about every case (the rules answer first) and scores both.
fn run_llm_eval(
    rules: &RuleSet,
    cases: &[Case],
    llm: &LlmDiagnoser,
) -> Result<EvalReport, Refusal> {
    let cases: Vec<EvalCase> = cases
        .iter()
        .map(|c| EvalCase {
            id: c.id.clone(),
            category: Some(c.category),
            fault_locus: Some(c.fault_locus),
            excerpt: c.excerpt.clone(),
        })
        .collect();
    Ok(runtime()?.block_on(evaluate_corpus(llm, &cases, |excerpt| {
        pipeline_answer(rules, excerpt)
    })))
}

fn accuracy(correct: usize, total: usize) -> String {
    let ratio = if total == 0 {
        0.0
    } else {
        correct as f64 / total as f64
    };
    format!("{ratio:.3} ({correct}/{total})")
}

fn label<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn print_llm_eval(report: &EvalReport, model: &str, format: Output) -> anyhow::Result<()> {
    let s = report.summary();
    let mut out = std::io::stdout().lock();
    if format.is_document() {
        let cases: Vec<serde_json::Value> = report
            .cases
            .iter()
            .map(|c| {
                serde_json::json!({
                    "id": c.id,
                    "expected_category": c.expected_category,
                    "expected_fault_locus": c.expected_locus,
                    "rules_category": c.rules.category,
                    "rules_fault_locus": c.rules.fault_locus,
                    "llm_category": c.llm.category,
                    "llm_fault_locus": c.llm.fault_locus,
                    "source": c.llm.source,
                    "outcome": c.outcome.label(),
                })
            })
            .collect();
        let value = serde_json::json!({
            "model": model,
            "summary": s,
            "cases": cases,
        });
        out.write_all(output::document(format, &value)?.as_bytes())?;
        return Ok(());
    }
    writeln!(out, "Rules and llm:{model}, {} cases", s.cases)?;
    writeln!(out)?;
    writeln!(out, "| metric | rules | llm:{model} |")?;
    writeln!(out, "|---|---|---|")?;
    writeln!(
        out,
        "| category accuracy | {} | {} |",
        accuracy(s.rules_category_correct, s.cases),
        accuracy(s.llm_category_correct, s.cases)
    )?;
    writeln!(
        out,
        "| fault locus accuracy | {} | {} |",
        accuracy(s.rules_locus_correct, s.cases),
        accuracy(s.llm_locus_correct, s.cases)
    )?;
    writeln!(out)?;
    let fallbacks: Vec<String> = s
        .fallbacks
        .iter()
        .map(|(reason, n)| format!("{reason} {n}"))
        .collect();
    writeln!(
        out,
        "Model answers used: {} of {}. Fallbacks to the rules' answer: {}.",
        s.refined,
        s.cases,
        if fallbacks.is_empty() {
            "none".to_owned()
        } else {
            fallbacks.join(", ")
        }
    )?;
    let differ: Vec<_> = report
        .cases
        .iter()
        .filter(|c| {
            !(c.rules_category_correct()
                && c.llm_category_correct()
                && c.rules_locus_correct()
                && c.llm_locus_correct())
        })
        .collect();
    if !differ.is_empty() {
        writeln!(out)?;
        writeln!(out, "Misses (either answer wrong)")?;
        writeln!(out)?;
        writeln!(out, "| case | label | rules | llm | outcome |")?;
        writeln!(out, "|---|---|---|---|---|")?;
        for c in differ {
            writeln!(
                out,
                "| {} | {} / {} | {} / {} | {} / {} | {} |",
                c.id,
                label(c.expected_category),
                label(c.expected_locus),
                label(c.rules.category),
                label(c.rules.fault_locus),
                label(c.llm.category),
                label(c.llm.fault_locus),
                c.outcome.label()
            )?;
        }
    }
    Ok(())
}

fn print_eval(e: &Evaluation, format: Output) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if format.is_document() {
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
        out.write_all(output::document(format, &value)?.as_bytes())?;
    } else {
        write!(out, "{}", e.to_markdown())?;
    }
    Ok(())
}
