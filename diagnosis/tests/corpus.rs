//! The shipped rules, alone and through the pipeline, on the development corpus
//! (tests/data/failure-logs-dev.jsonl): category accuracy at least 0.90 and culprit
//! accuracy at least 0.85.

use warden_diagnosis::eval::{evaluate, evaluate_with, parse_corpus};
use warden_diagnosis::pipeline::{PipelineOptions, diagnose_lines};
use warden_diagnosis::rules::RuleSet;

#[test]
fn shipped_rules_meet_the_accuracy_floor_on_the_dev_corpus() {
    let text = include_str!("data/failure-logs-dev.jsonl");
    let cases = parse_corpus(text).expect("corpus parses");
    assert_eq!(cases.len(), 37, "the dev corpus has 37 cases");
    let rules = RuleSet::builtin().expect("shipped rules load");
    let eval = evaluate(&rules, &cases).expect("evaluates");
    let report = eval.to_markdown();
    println!("{report}");
    assert!(
        eval.category_accuracy() >= 0.90,
        "category accuracy {:.3}\n{report}",
        eval.category_accuracy()
    );
    assert!(
        eval.culprit_accuracy() >= 0.85,
        "culprit accuracy {:.3}\n{report}",
        eval.culprit_accuracy()
    );
    assert!(eval.culprit_scored >= 15, "{report}");
}

#[test]
fn the_pipeline_meets_the_accuracy_floor_and_keeps_the_rules_labels() {
    let text = include_str!("data/failure-logs-dev.jsonl");
    let cases = parse_corpus(text).expect("corpus parses");
    let rules = RuleSet::builtin().expect("shipped rules load");
    let opts = PipelineOptions::default();
    let through_pipeline = evaluate_with(&cases, |lines| {
        let d = diagnose_lines(&rules, lines, &opts);
        assert!(d.evidence.len() <= opts.max_evidence, "{d:#?}");
        d
    })
    .expect("evaluates");
    let report = through_pipeline.to_markdown();
    println!("{report}");
    assert!(
        through_pipeline.category_accuracy() >= 0.90,
        "category accuracy {:.3}\n{report}",
        through_pipeline.category_accuracy()
    );
    assert!(
        through_pipeline.culprit_accuracy() >= 0.85,
        "culprit accuracy {:.3}\n{report}",
        through_pipeline.culprit_accuracy()
    );
    // Category and locus are the rules' own: the pipeline adds culprit ranks and
    // evidence, never a different label.
    let rules_only = evaluate(&rules, &cases).expect("evaluates");
    for (p, r) in through_pipeline.results.iter().zip(&rules_only.results) {
        assert_eq!((p.got, p.got_locus), (r.got, r.got_locus), "{}", p.id);
    }
    assert!(through_pipeline.culprit_correct >= rules_only.culprit_correct);
}

/// Logs of the same classes written apart from the dev corpus (other frameworks'
/// wording, Slurm and kernel lines, gloo barriers): the rules must generalize to them.
#[test]
fn shipped_rules_generalize_to_cases_outside_the_dev_corpus() {
    let text = include_str!("data/extra-cases.jsonl");
    let cases = parse_corpus(text).expect("cases parse");
    assert!(cases.len() >= 20);
    let rules = RuleSet::builtin().expect("shipped rules load");
    let opts = PipelineOptions::default();
    let eval =
        evaluate_with(&cases, |lines| diagnose_lines(&rules, lines, &opts)).expect("evaluates");
    let report = eval.to_markdown();
    println!("{report}");
    assert!(
        eval.category_accuracy() >= 0.90,
        "category accuracy {:.3}\n{report}",
        eval.category_accuracy()
    );
    assert!(
        eval.culprit_accuracy() >= 0.75,
        "culprit accuracy {:.3}\n{report}",
        eval.culprit_accuracy()
    );
}
