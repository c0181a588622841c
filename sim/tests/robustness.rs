//! The controller's verdicts survive a messy transport: every batch delivered twice,
//! neighbouring batches swapped, on top of the scenarios' own skewed clocks and lost
//! batches. Duplicates and reordering must neither create incidents nor hide them.

use std::path::Path;

use warden_engine::{Encoding, Engine, EngineConfig, IncidentChange};
use warden_model::Timestamp;
use warden_sim::{Report, RunOptions, SIM_EPOCH, Scenario, Simulation, Sink, score};

/// Delivers each batch twice and swaps every pair of consecutive batches.
struct Messy {
    engine: Engine,
    held: Option<Vec<u8>>,
}

impl Sink for Messy {
    fn deliver(&mut self, body: &[u8], now: Timestamp) {
        match self.held.take() {
            None => self.held = Some(body.to_vec()),
            Some(earlier) => {
                for b in [body, &earlier, body, &earlier] {
                    // The same bytes a second time, and a batch after a newer one.
                    let _ = self.engine.ingest(b, Encoding::Binary, now);
                }
            }
        }
    }

    fn tick(&mut self, now: Timestamp) -> Vec<IncidentChange> {
        self.engine.tick(now)
    }
}

fn messy_run(file: &str) -> Report {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(file);
    let scenario = Scenario::load(&path).expect("shipped scenario loads");
    let mut sink = Messy {
        engine: Engine::new(EngineConfig::default(), SIM_EPOCH),
        held: None,
    };
    let mut sim = Simulation::new(&scenario, RunOptions::default());
    sim.run_to_end(&mut sink);
    assert!(
        sink.engine.stats().stale_records > 0,
        "duplicates were delivered"
    );
    Report::new(&sim, sink.engine.incident_views(None, None, None), 0.0)
}

#[test]
fn duplicated_and_reordered_batches_create_no_incident() {
    let report = messy_run("clean-heavy-64.yaml");
    assert!(report.incidents.is_empty(), "{:#?}", report.incidents);
}

#[test]
fn duplicated_and_reordered_batches_keep_every_culprit() {
    let report = messy_run("mixed-crash.yaml");
    let card = score(std::slice::from_ref(&report));
    let wrong: Vec<String> = card
        .failures()
        .into_iter()
        .filter(|f| !f.contains("latency"))
        .collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert_eq!(
        report.incidents.len(),
        report.faults.len(),
        "{:#?}",
        report.incidents
    );
}
