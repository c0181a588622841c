//! Fuzz target: the loaders of the rule files under `rules/`: the diagnosis log rules
//! (`warden_diagnosis::rules::RuleSet::from_sources`, `rules/logs/*.yaml`), the XID
//! catalog (`warden_agent::xid::XidCatalog::parse`, `rules/xid.yaml`) and the log metric
//! presets (`warden_agent::logs::PresetCatalog::parse`, `rules/log-presets.yaml`).
//!
//! The first byte picks the loader, the rest is the file. Checked: nothing panics, a
//! bad file is an error rather than a crash; what loads is used: a rule set scans the
//! file's own lines, every catalog entry is found by its code, and a preset catalog
//! extracts from the file's lines with every fast field reader giving its regex's
//! answer (fuzzed field patterns included).

use std::sync::Arc;

use warden_agent::logs::{Extractor, LogLine, PresetCatalog};
use warden_agent::xid::XidCatalog;
use warden_diagnosis::rules::{RuleSet, Scratch};
use warden_model::wire::LogStream;

/// One input, as libFuzzer passes it (`fuzz_targets/rules.rs`).
pub fn run(input: &[u8]) {
    let Some((&which, data)) = input.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(data);
    match which % 3 {
        0 => log_rules(&text),
        1 => xid_catalog(&text),
        _ => presets(&text),
    }
}

fn log_rules(text: &str) {
    let Ok(rules) = RuleSet::from_sources([("fuzz.yaml".to_owned(), text.to_owned())]) else {
        return;
    };
    let mut scratch = Scratch::default();
    let mut hits = Vec::new();
    for line in text.lines() {
        hits.clear();
        rules.scan(line, &mut scratch, &mut hits);
        for r in rules.rules() {
            let _ = (r.needles(), r.patterns().count());
        }
    }
}

fn xid_catalog(text: &str) {
    let Ok(catalog) = XidCatalog::parse(text) else {
        return;
    };
    let entries = catalog.entries();
    assert_eq!(entries.len(), catalog.len());
    for e in entries {
        let found = catalog
            .get(e.code)
            .expect("every entry is found by its code");
        assert_eq!(found.code, e.code);
        assert_eq!(catalog.severity(e.code), e.severity);
    }
}

fn presets(text: &str) {
    let Ok(catalog) = PresetCatalog::parse(text) else {
        return;
    };
    assert_eq!(catalog.names().len(), catalog.len());
    let mut x = Extractor::with_presets(&catalog);
    let source: Arc<str> = Arc::from("fuzz.log");
    for (i, t) in text.lines().enumerate() {
        let disagreements = catalog.fast_path_disagreements(t);
        assert!(
            disagreements.is_empty(),
            "fast path and regex disagree on {t:?}: {disagreements:?}"
        );
        let _ = x.extract(&LogLine {
            source: source.clone(),
            source_index: 0,
            job: None,
            rank: Some(0),
            local_rank: None,
            at_ns: i as i64,
            stream: LogStream::Stdout,
            text: t.to_owned(),
            truncated: false,
            lines: 1,
        });
    }
}
