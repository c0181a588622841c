//! Fuzz target: PyTorch ProcessGroupNCCL watchdog, work-status, flight-recorder dump
//! signal and desync-report lines (`warden_diagnosis::watchdog`), read as the diagnosis
//! reads a log (`input::LineReader`) and run through the whole rules pipeline
//! (`pipeline::Pipeline`: classifier, template miner, watchdog scan, evidence).
//!
//! Checked: nothing panics; the line reader numbers lines in order, from 1; the lagging ranks
//! named are ascending, distinct and not empty, cite only lines that were read, and at
//! most 16 of them; the explanation is short whatever the world size (up to
//! `u32::MAX`, which must cost nothing); the diagnosis keeps to its evidence bound and
//! cites only lines that were read, with a confidence between 0 and 1.

use std::sync::OnceLock;

use warden_diagnosis::input::LineReader;
use warden_diagnosis::rules::RuleSet;
use warden_diagnosis::watchdog::{self, WatchdogScan};
use warden_diagnosis::{LogLine, Pipeline, PipelineOptions};

fn rules() -> &'static RuleSet {
    static R: OnceLock<RuleSet> = OnceLock::new();
    R.get_or_init(|| RuleSet::builtin().expect("the shipped log rules load"))
}

/// One input, as libFuzzer passes it (`fuzz_targets/watchdog.rs`).
pub fn run(input: &[u8]) {
    let Some((&knob, data)) = input.split_first() else {
        return;
    };
    let max_line = [64, 512, 4096, 65536][usize::from(knob & 3)];
    let mut reader = LineReader::new(data).with_max_line(max_line);
    let mut lines: Vec<LogLine> = Vec::new();
    loop {
        match reader.next_line() {
            Ok(Some(l)) => {
                assert_eq!(l.id, lines.len() as u64 + 1, "ids are line numbers, from 1");
                lines.push(l);
            }
            Ok(None) => break,
            Err(_) => {
                // Refused as binary: read the text as it is, so the parsers still see it.
                lines = String::from_utf8_lossy(data)
                    .split('\n')
                    .enumerate()
                    .map(|(i, t)| LogLine {
                        id: i as u64 + 1,
                        text: t.to_owned(),
                        ..LogLine::default()
                    })
                    .collect();
                break;
            }
        }
    }
    if knob & 4 != 0 {
        for l in &mut lines {
            l.rank = Some((l.id % 8) as u32);
            l.at_ms = Some(1_700_000_000_000 + l.id as i64);
        }
    }
    // 1..=14 ranks, or a client's absurd number: the largest believed, or u32::MAX.
    let world_size = (knob & 8 != 0).then_some(match knob >> 4 {
        14 => watchdog::MAX_WORLD_SIZE,
        15 => u32::MAX,
        n => u32::from(n) + 1,
    });

    let mut scan = WatchdogScan::new();
    let mut opts = PipelineOptions {
        world_size,
        ..PipelineOptions::default()
    };
    if knob & 0x80 != 0 {
        opts.max_evidence = 3;
    }
    let max_evidence = opts.max_evidence;
    let mut pipeline = Pipeline::new(rules(), opts);
    for l in &lines {
        let _ = watchdog::parse(l);
        scan.push(l);
        pipeline.push(l);
    }
    let n = lines.len() as u64;
    if let Some(lag) = scan.finish(world_size) {
        assert!(!lag.ranks.is_empty(), "an answer names someone");
        assert!(
            lag.ranks.windows(2).all(|w| w[0] < w[1]),
            "ranks ascending and distinct: {:?}",
            lag.ranks
        );
        assert!(lag.evidence.len() <= 16);
        assert!(
            lag.explanation.len() <= 1024,
            "explanation bounded: {} bytes",
            lag.explanation.len()
        );
        assert!(
            lag.evidence.iter().all(|&id| (1..=n).contains(&id)),
            "evidence cites read lines"
        );
    }
    let d = pipeline.finish();
    assert!(d.evidence.len() <= max_evidence);
    assert!(
        d.evidence.iter().all(|e| (1..=n).contains(&e.id)),
        "evidence cites read lines"
    );
    assert!(
        (0.0..=1.0).contains(&d.confidence),
        "confidence {}",
        d.confidence
    );
}
