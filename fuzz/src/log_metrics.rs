//! Fuzz target: training-log metric and watchdog extraction with the shipped presets
//! (`warden_agent::logs::{extract, presets, numfield, attribution}`,
//! `rules/log-presets.yaml`).
//!
//! Every line of the input goes through an `Extractor` built from the shipped presets
//! (every enabled preset, an explicit preset list, and a custom pattern), with and
//! without a rank; the whole input also goes through as one multi-line record. Checked:
//! nothing panics; the fast literal-and-number reader of every preset field gives the
//! field regex's answer; a line is notable exactly when it holds a notable needle; a
//! multi-line record yields no metric; a metric with a rank has a wire form that keeps
//! its step and values.

use std::sync::{Arc, Mutex, OnceLock};

use warden_agent::logs::attribution::{line_prefix, rank_tag};
use warden_agent::logs::extract::is_notable_text;
use warden_agent::logs::{
    CustomPattern, Extractor, LogLine, PresetCatalog, SourceConfig, TailConfig, parse_watchdog,
};
use warden_model::wire::LogStream;

const T0: i64 = 1_700_000_000_000_000_000;

fn catalog() -> &'static PresetCatalog {
    if let Some(e) = PresetCatalog::builtin_error() {
        panic!("the shipped presets do not load: {e}");
    }
    PresetCatalog::builtin()
}

/// One extractor for the whole run (building one compiles every preset's regexes).
fn extractor() -> &'static Mutex<Extractor> {
    static X: OnceLock<Mutex<Extractor>> = OnceLock::new();
    X.get_or_init(|| {
        let custom = CustomPattern {
            name: "custom".into(),
            regex: r"step (?P<step>\d+) loss (?P<loss>%NUM%)(?: tput (?P<throughput>%NUM%))?"
                .into(),
            needle: Some("step ".into()),
            throughput_unit: Default::default(),
        };
        let cfg = TailConfig {
            sources: vec![
                SourceConfig::new(["/a/*.log"]),
                SourceConfig {
                    presets: Some(vec!["megatron".into(), "deepspeed".into()]),
                    ..SourceConfig::new(["/b/*.log"])
                },
                SourceConfig {
                    presets: Some(vec![]),
                    patterns: vec![custom],
                    ..SourceConfig::new(["/c/*.log"])
                },
            ],
            ..TailConfig::default()
        };
        Mutex::new(Extractor::new(&cfg, catalog()).expect("the fuzz extractor config is valid"))
    })
}

/// One input, as libFuzzer passes it (`fuzz_targets/log_metrics.rs`).
pub fn run(input: &[u8]) {
    let Some((&knob, data)) = input.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(data);
    let source: Arc<str> = Arc::from("/a/rank3.log");
    let mut x = extractor().lock().unwrap_or_else(|p| p.into_inner());
    for (i, t) in text.split('\n').enumerate() {
        let disagreements = catalog().fast_path_disagreements(t);
        assert!(
            disagreements.is_empty(),
            "fast path and regex disagree on {t:?}: {disagreements:?}"
        );
        let line = LogLine {
            source: source.clone(),
            source_index: usize::from(knob) % 4,
            job: Some(Arc::from("job-1")),
            rank: (knob & 0x10 != 0).then_some(3),
            local_rank: None,
            at_ns: T0 + i as i64,
            stream: LogStream::Stdout,
            text: t.to_owned(),
            truncated: false,
            lines: 1,
        };
        let e = x.extract(&line);
        assert_eq!(
            e.notable,
            is_notable_text(t),
            "notable exactly when a needle is there"
        );
        if let Some(m) = &e.metric {
            assert_eq!(m.at_ns, line.at_ns);
            let wire = m
                .to_wire(Some(0))
                .expect("a metric with a fallback rank has a wire form");
            assert_eq!(wire.step, m.step);
            assert_eq!(wire.rank, m.rank.unwrap_or(0));
            assert_eq!(
                wire.loss.map(f64::to_bits),
                m.loss.map(f64::to_bits),
                "the loss is carried as read"
            );
        }
        if let Some(w) = &e.watchdog {
            let _ = w.coll_op();
        }
        let _ = parse_watchdog(t);
        let _ = line_prefix(t);
        let _ = rank_tag(t);
    }
    let lines = text.split('\n').count() as u32;
    if lines > 1 {
        let record = LogLine {
            source,
            source_index: 0,
            job: None,
            rank: None,
            local_rank: None,
            at_ns: T0,
            stream: LogStream::Stderr,
            text: text.into_owned(),
            truncated: false,
            lines,
        };
        let e = x.extract(&record);
        assert!(
            e.metric.is_none(),
            "multi-line records are not read for metrics"
        );
        assert!(e.notable, "a multi-line record is notable");
    }
}
