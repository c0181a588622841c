//! docs/DIAGNOSIS.md lists every shipped rule (every message family) with an example
//! line: a rule added without its line in the docs fails here.

use warden_diagnosis::rules::RuleSet;

#[test]
fn every_shipped_rule_is_listed_in_the_diagnosis_docs() {
    let doc = include_str!("../../docs/DIAGNOSIS.md");
    let rules = RuleSet::builtin().expect("shipped rules load");
    let missing: Vec<&str> = rules
        .rules()
        .iter()
        .map(|r| r.id.as_str())
        .filter(|id| !doc.contains(&format!("| `{id}` |")))
        .collect();
    assert!(
        missing.is_empty(),
        "rules missing from docs/DIAGNOSIS.md's message families: {missing:?}"
    );
}
