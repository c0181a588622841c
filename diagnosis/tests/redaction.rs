//! The redaction corpus (tests/data/redaction-corpus.txt): real-looking log lines of
//! training jobs, launchers and shells, each with the secrets that must not survive and
//! the text that must, through both entry points the controller and the LLM client use.

use warden_diagnosis::redact::{Pseudonyms, Redactor};

/// One case of the corpus.
#[derive(Debug, Default)]
struct Case {
    /// Line number of its `in:` line in the corpus file.
    at: usize,
    input: String,
    gone: Vec<String>,
    keep: Vec<String>,
    out: Option<String>,
}

fn parse(text: &str) -> Vec<Case> {
    let mut cases: Vec<Case> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let at = i + 1;
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let (field, value) = line
            .split_once(": ")
            .or_else(|| line.strip_suffix(':').map(|f| (f, "")))
            .unwrap_or_else(|| panic!("corpus line {at}: no `field: value`: {line:?}"));
        if field == "in" {
            cases.push(Case {
                at,
                input: value.to_owned(),
                ..Case::default()
            });
            continue;
        }
        let case = cases
            .last_mut()
            .unwrap_or_else(|| panic!("corpus line {at}: `{field}:` before any `in:`"));
        match field {
            "gone" => case.gone.push(value.to_owned()),
            "keep" => case.keep.push(value.to_owned()),
            "out" => case.out = Some(value.to_owned()),
            _ => panic!("corpus line {at}: unknown field {field:?}"),
        }
    }
    cases
}

/// Every problem with one case's redacted form, in words.
fn problems(case: &Case, got: &str) -> Vec<String> {
    let mut p = Vec::new();
    for secret in &case.gone {
        assert!(
            !secret.is_empty() && case.input.contains(secret),
            "corpus line {}: the secret {secret:?} is not in the line",
            case.at
        );
        if got.contains(secret.as_str()) {
            p.push(format!("secret {secret:?} survived"));
        }
    }
    for text in &case.keep {
        assert!(
            case.input.contains(text.as_str()),
            "corpus line {}: the kept text {text:?} is not in the line",
            case.at
        );
        if !got.contains(text.as_str()) {
            p.push(format!("kept text {text:?} was changed"));
        }
    }
    if case.gone.is_empty() && got != case.input {
        p.push("a line without secrets was changed".to_owned());
    }
    if let Some(out) = &case.out
        && got != out
    {
        p.push(format!("expected {out:?}"));
    }
    p
}

#[test]
fn redaction_removes_every_secret_of_the_corpus_and_nothing_else() {
    let cases = parse(include_str!("data/redaction-corpus.txt"));
    let negative = cases.iter().filter(|c| c.gone.is_empty()).count();
    let positive = cases.len() - negative;
    assert!(
        positive >= 60 && negative >= 15,
        "the corpus has {positive} cases with secrets and {negative} without"
    );
    let redactor = Redactor::default();
    let mut failures = Vec::new();
    for case in &cases {
        let got = redactor.redact_secrets(&case.input);
        // The batch form (what incidents and LLM prompts go through) must agree.
        let batch = redactor.redact_batch(&[case.input.as_str()], &[], &mut Pseudonyms::new());
        let mut p = problems(case, &got);
        if batch.first().map(String::as_str) != Some(got.as_str()) {
            p.push(format!("redact_batch gave {batch:?}"));
        }
        if !p.is_empty() {
            failures.push(format!(
                "line {}: {}\n  in:  {}\n  got: {got}",
                case.at,
                p.join("; "),
                case.input
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases fail ({positive} with secrets, {negative} without):\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
