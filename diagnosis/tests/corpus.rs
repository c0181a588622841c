//! The shipped rules, alone and through the pipeline, on the labelled corpus: the
//! development set (tests/data/failure-logs-dev.jsonl), the cases reconstructed from
//! public threads (tests/data/public/), and the scorer itself, which must fail wrong
//! answers.

use warden_diagnosis::eval::{Case, duplicate_id, evaluate, evaluate_with, parse_corpus};
use warden_diagnosis::pipeline::{PipelineOptions, diagnose_lines};
use warden_diagnosis::rules::RuleSet;
use warden_diagnosis::{Category, LogLine};

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

/// `cases` through the pipeline `warden diagnose` runs, and the report (printed).
fn through_the_pipeline(cases: &[Case]) -> (warden_diagnosis::eval::Evaluation, String) {
    let rules = RuleSet::builtin().expect("shipped rules load");
    let opts = PipelineOptions::default();
    let eval =
        evaluate_with(cases, |lines| diagnose_lines(&rules, lines, &opts)).expect("evaluates");
    let report = eval.to_markdown();
    println!("{report}");
    (eval, report)
}

/// Logs of the same classes written apart from the dev corpus (other frameworks'
/// wording, Slurm and kernel lines, gloo barriers): the rules must generalize to them.
#[test]
fn shipped_rules_generalize_to_cases_outside_the_dev_corpus() {
    let text = include_str!("data/extra-cases.jsonl");
    let cases = parse_corpus(text).expect("cases parse");
    assert!(cases.len() >= 20);
    let (eval, report) = through_the_pipeline(&cases);
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

fn data_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

/// The cases of every `*.jsonl` file in `dir`, in name order.
fn cases_in(dir: &std::path::Path) -> Vec<Case> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("readable entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    let mut cases = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).expect("corpus file reads");
        cases.extend(parse_corpus(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display())));
    }
    cases
}

/// The whole labelled corpus: the development set and the cases reconstructed from
/// public threads (tests/data/public/*.jsonl).
fn public_corpus() -> Vec<Case> {
    let text = std::fs::read_to_string(data_dir().join("failure-logs-dev.jsonl"))
        .expect("dev corpus reads");
    let mut cases = parse_corpus(&text).expect("dev corpus parses");
    cases.extend(cases_in(&data_dir().join("public")));
    cases
}

/// At least 150 cases from public threads, every category at least 8 times, unique ids,
/// each public case with its thread and its message family.
#[test]
fn the_public_corpus_covers_every_category() {
    let cases = public_corpus();
    assert!(cases.len() >= 150, "{} cases", cases.len());
    assert_eq!(duplicate_id(&cases), None, "a case id twice");
    for c in &cases {
        let source = c.source.as_deref().unwrap_or_default();
        assert!(
            source.starts_with("https://"),
            "{}: source {source:?}",
            c.id
        );
        if !c.id.starts_with("fl-") {
            assert!(
                c.family.as_deref().is_some_and(|f| !f.is_empty()),
                "{}: no family",
                c.id
            );
        }
    }
    for category in Category::ALL {
        let n = cases.iter().filter(|c| c.category == category).count();
        assert!(n >= 8, "{category}: {n} cases");
    }
}

/// The whole corpus through the pipeline `warden diagnose` runs, at the level it was
/// left (a regression floor). Each set of public cases was scored once before any rule
/// was written for it; those first looks are in docs/DIAGNOSIS.md and are the measure
/// of how the rules do on logs they were not written for.
#[test]
fn the_public_corpus_keeps_its_accuracy() {
    let cases = public_corpus();
    let (eval, report) = through_the_pipeline(&cases);
    assert!(eval.category_accuracy() >= 0.97, "{report}");
    // The locus floor sits lower than the category's: `h7`'s writers labelled the locus
    // of a few hangs and launcher failures by the thread's conclusion (user code) where
    // the corpus's convention is the framework's or the infrastructure's, and those
    // labels are kept as written. The culprit floor is where `h9` left it: culprits a
    // line does not name where it is printed (a Ray task's own header far from its
    // error, a rank tag only on the traceback after it, a pid whose rank another line
    // gives), and judgement calls between the process and the first frame that crashed.
    assert!(eval.locus_accuracy() >= 0.955, "{report}");
    assert!(eval.culprit_accuracy() >= 0.92, "{report}");
    assert!(eval.culprit_scored >= 200, "{report}");
}

/// The scorer cannot pass on wrong answers: each case answered with another case's
/// diagnosis scores far below the floor, and a culprit that names every place at once
/// is wrong wherever the label names one place of a kind.
#[test]
fn the_scorer_fails_wrong_answers() {
    let cases = public_corpus();
    let rules = RuleSet::builtin().expect("shipped rules load");
    let opts = PipelineOptions::default();
    let answers: Vec<_> = cases
        .iter()
        .map(|c| {
            let lines: Vec<LogLine> = c
                .excerpt
                .lines()
                .zip(1..)
                .map(|(t, id)| LogLine {
                    id,
                    text: t.to_owned(),
                    ..LogLine::default()
                })
                .collect();
            diagnose_lines(&rules, &lines, &opts)
        })
        .collect();
    // Every case gets another case's answer, far from it in the corpus (files group
    // cases by category): index i gets the answer of (i * 211 + 97) mod n.
    let n = answers.len();
    let mut i = 0;
    let shifted = evaluate_with(&cases, |_| {
        let mut j = (i * 211 + 97) % n;
        if j == i {
            j = (j + 1) % n;
        }
        i += 1;
        answers[j].clone()
    })
    .expect("evaluates");
    assert!(
        shifted.category_accuracy() < 0.5,
        "{}",
        shifted.to_markdown()
    );
    assert!(
        shifted.culprit_accuracy() < 0.5,
        "{}",
        shifted.to_markdown()
    );

    let mut everything = warden_diagnosis::Culprit::default();
    for a in &answers {
        let c = &a.culprit;
        everything.ranks.extend(&c.ranks);
        everything.nodes.extend(c.nodes.iter().cloned());
        everything.gpus.extend(c.gpus.iter().cloned());
        everything.pids.extend(&c.pids);
        everything.peers.extend(c.peers.iter().cloned());
    }
    let all_at_once = evaluate_with(&cases, |_| warden_diagnosis::Diagnosis {
        culprit: everything.clone(),
        ..warden_diagnosis::Diagnosis::unknown()
    })
    .expect("evaluates");
    assert!(
        all_at_once.culprit_accuracy() < 0.2,
        "{}",
        all_at_once.to_markdown()
    );
}
