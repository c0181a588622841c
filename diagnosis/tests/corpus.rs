//! The shipped rules on the development corpus (tests/data/failure-logs-dev.jsonl):
//! category accuracy at least 0.90 and culprit accuracy at least 0.85.

use warden_diagnosis::eval::{evaluate, parse_corpus};
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
