//! Scenario validation: every bad scenario is rejected with an error naming its field.

use std::path::Path;

use warden_sim::{FaultKind, Scenario, ScenarioError};

const BASE: &str = "job: {name: v, nodes: 16, gpus_per_node: 8}\nsteps: 100\n";

fn err(yaml: &str) -> ScenarioError {
    match Scenario::from_yaml(yaml, "t") {
        Ok(s) => panic!("accepted an invalid scenario: {s:?}"),
        Err(e) => e,
    }
}

fn check(yaml: &str, expect: &str) {
    let e = err(yaml);
    let text = e.to_string();
    assert!(
        text.contains(expect),
        "error {text:?} does not contain {expect:?}"
    );
}

fn with_faults(faults: &str) -> String {
    format!("{BASE}faults:\n{faults}")
}

#[test]
fn the_example_scenario_parses() {
    let yaml = "
seed: 7
job:
  name: demo-70b
  nodes: 16
  gpus_per_node: 8
  parallelism: {tp: 8, pp: 2, dp: 8}
  iteration_secs: 1.5
  jitter: 0.03
noise:
  checkpoint_every_steps: 100
  checkpoint_secs: 25
  hiccup_prob: 0.01
  hiccup_secs: 0.5
  clock_skew_ms: 40
  batch_drop_prob: 0.0
steps: 600
faults:
  - {step: 120, kind: straggler, node: node-05, slowdown: 1.3}
  - {step: 200, kind: slow_link, node: node-11, slowdown: 2.0}
  - {step: 300, kind: nan, rank: 12}
  - {step: 350, kind: xid, node: node-09, gpu: 3, code: 63}
  - {step: 450, kind: hang, rank: 77}
";
    let s = Scenario::from_yaml(yaml, "demo").expect("valid");
    assert_eq!(s.name, "demo");
    assert_eq!(s.ranks(), 128);
    assert_eq!(s.faults.len(), 5);
    assert_eq!(s.faults[4].kind, FaultKind::Hang { rank: 77 });
    assert_eq!(
        s.faults[0].kind,
        FaultKind::Straggler {
            node: "node-05".into(),
            slowdown: 1.3
        }
    );
    assert!(s.stopping_fault().is_some());
}

#[test]
fn fault_defaults_apply() {
    let s = Scenario::from_yaml(
        &with_faults("  - {step: 1, kind: straggler, node: node-00}\n  - {step: 2, kind: slow_link, node: node-01, until_step: 9}\n"),
        "t",
    )
    .expect("valid");
    assert_eq!(
        s.faults[0].kind,
        FaultKind::Straggler {
            node: "node-00".into(),
            slowdown: 1.3
        }
    );
    assert_eq!(
        s.faults[1].kind,
        FaultKind::SlowLink {
            node: "node-01".into(),
            slowdown: 2.0
        }
    );
    assert_eq!(s.faults[1].until_step, Some(9));
}

#[test]
fn parallelism_must_cover_the_world() {
    check(
        "job: {nodes: 16, gpus_per_node: 8, parallelism: {tp: 8, pp: 2, dp: 6}}\nsteps: 10\n",
        "job.parallelism: tp*pp*dp = 96 but nodes*gpus_per_node = 128",
    );
    check(
        "job: {nodes: 2, parallelism: {tp: 0}}\nsteps: 10\n",
        "job.parallelism.tp: must be >= 1",
    );
}

#[test]
fn out_of_range_rank_names_the_fault() {
    check(
        &with_faults(
            "  - {step: 1, kind: nan, rank: 3}\n  - {step: 2, kind: nan, rank: 4}\n  - {step: 3, kind: hang, rank: 300}\n",
        ),
        "faults[2].rank: 300 is out of range (job has 128 ranks)",
    );
}

#[test]
fn missing_fault_fields_are_named() {
    check(
        &with_faults("  - {step: 1, kind: straggler}\n"),
        "faults[0]: kind straggler needs field node",
    );
    check(
        &with_faults("  - {step: 1, kind: xid, node: node-01, gpu: 2}\n"),
        "faults[0]: kind xid needs field code",
    );
    check(
        &with_faults("  - {step: 1, kind: crash}\n"),
        "faults[0]: kind crash needs field rank",
    );
}

#[test]
fn unknown_kind_is_named() {
    check(
        &with_faults("  - {step: 1, kind: nan, rank: 1}\n  - {step: 5, kind: meltdown, rank: 1}\n"),
        "faults[1].kind: unknown kind \"meltdown\"",
    );
}

#[test]
fn fields_foreign_to_the_kind_are_rejected() {
    check(
        &with_faults("  - {step: 1, kind: hang, rank: 1, node: node-00}\n"),
        "faults[0].node: is not a field of kind hang",
    );
}

#[test]
fn numbers_out_of_range_are_named() {
    check(
        "job: {iteration_secs: 0}\nsteps: 10\n",
        "job.iteration_secs: must be > 0",
    );
    check(
        "job: {iteration_secs: -1.5}\nsteps: 10\n",
        "job.iteration_secs: must be > 0",
    );
    check("job: {}\nsteps: 0\n", "steps: must be >= 1");
    check("job: {jitter: 1.5}\nsteps: 10\n", "job.jitter");
    check(
        "job: {layers: 0}\nsteps: 10\n",
        "job.layers: must be in [1, 256]",
    );
    check(
        "job: {layers: 257}\nsteps: 10\n",
        "job.layers: must be in [1, 256]",
    );
    check(
        "job: {}\nnoise: {hiccup_prob: 2}\nsteps: 10\n",
        "noise.hiccup_prob",
    );
    check(
        "job: {}\nnoise: {batch_drop_prob: -0.1}\nsteps: 10\n",
        "noise.batch_drop_prob",
    );
    check(
        &with_faults("  - {step: 1, kind: straggler, node: node-00, slowdown: 0.5}\n"),
        "faults[0].slowdown: must be >= 1.0",
    );
    check(
        &with_faults("  - {step: 100, kind: nan, rank: 1}\n"),
        "faults[0].step: 100 is not before the end of the run",
    );
    check(
        &with_faults("  - {step: 10, until_step: 20, kind: hang, rank: 1}\n"),
        "faults[0].until_step: a hang stops the job for good",
    );
    check(
        &with_faults("  - {step: 10, until_step: 10, kind: nan, rank: 1}\n"),
        "faults[0].until_step",
    );
}

#[test]
fn nodes_and_gpus_must_exist() {
    check(
        &with_faults("  - {step: 1, kind: straggler, node: node-16}\n"),
        "faults[0].node: no node \"node-16\"",
    );
    check(
        &with_faults("  - {step: 1, kind: straggler, node: node-5}\n"),
        "faults[0].node",
    );
    check(
        &with_faults("  - {step: 1, kind: xid, node: node-01, gpu: 8, code: 79}\n"),
        "faults[0].gpu: 8 is out of range",
    );
}

#[test]
fn at_most_one_stopping_fault_and_it_comes_last() {
    check(
        &with_faults("  - {step: 10, kind: hang, rank: 1}\n  - {step: 20, kind: crash, rank: 2}\n"),
        "faults[1]: at most one fault may stop the job",
    );
    check(
        &with_faults(
            "  - {step: 10, kind: xid, node: node-00, gpu: 1, code: 79}\n  - {step: 20, kind: xid, node: node-00, gpu: 2, code: 48}\n",
        ),
        "faults[1]: at most one fault may stop the job",
    );
    check(
        &with_faults("  - {step: 50, kind: hang, rank: 1}\n  - {step: 60, kind: nan, rank: 2}\n"),
        "faults[0].step: a fault that stops the job must come last",
    );
    // A non-fatal XID before the fatal one is fine.
    Scenario::from_yaml(
        &with_faults("  - {step: 10, kind: xid, node: node-00, gpu: 1, code: 63}\n  - {step: 20, kind: xid, node: node-00, gpu: 2, code: 79}\n"),
        "t",
    )
    .expect("valid");
}

#[test]
fn type_errors_name_the_path_and_position() {
    let e = err("job: {nodes: many}\nsteps: 10\n");
    let text = e.to_string();
    assert!(text.starts_with("job.nodes:"), "{text}");
    assert!(text.contains("line 1"), "{text}");
    match e {
        ScenarioError::Parse { line, column, .. } => {
            assert_eq!(line, Some(1));
            assert!(column.is_some());
        }
        other => panic!("expected a parse error, got {other:?}"),
    }
    check(
        &with_faults("  - {step: one, kind: nan, rank: 1}\n"),
        "faults[0].step:",
    );
    check(
        "job: {}\nsteps: 10\nfaults:\n  - {step: 1, kind: nan, rank: -3}\n",
        "faults[0].rank:",
    );
}

#[test]
fn unknown_fields_are_rejected_with_their_path() {
    check(
        "job: {nodes: 2, gpu_per_node: 8}\nsteps: 10\n",
        "gpu_per_node",
    );
    check("job: {nodes: 2}\nsteps: 10\nnoise: {jiter: 0.1}\n", "noise");
    check("job: {}\nsteps: 10\nextra: 1\n", "unknown field `extra`");
    check(
        &with_faults("  - {step: 1, kind: nan, rank: 1, sevrity: 3}\n"),
        "faults[0]",
    );
}

#[test]
fn job_and_steps_are_required() {
    check("steps: 10\n", "missing field `job`");
    check("job: {}\n", "missing field `steps`");
    check("job: [1, 2]\nsteps: 3\n", "job");
    check(": : :\n", "");
}

#[test]
fn every_problem_is_reported_at_once() {
    let e = err("job: {iteration_secs: 0, jitter: 3}\nsteps: 0\n");
    let paths = e.paths();
    assert!(
        paths.contains(&"job.iteration_secs".to_owned()),
        "{paths:?}"
    );
    assert!(paths.contains(&"job.jitter".to_owned()), "{paths:?}");
    assert!(paths.contains(&"steps".to_owned()), "{paths:?}");
}

#[test]
fn load_names_the_file_and_uses_its_stem() {
    let dir = std::env::temp_dir().join(format!("warden-sim-validation-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let good = dir.join("my-run.yaml");
    std::fs::write(&good, BASE).expect("write");
    assert_eq!(Scenario::load(&good).expect("valid").name, "my-run");
    let bad = dir.join("broken.yaml");
    std::fs::write(&bad, "job: {iteration_secs: 0}\nsteps: 1\n").expect("write");
    let text = Scenario::load(&bad).expect_err("invalid").to_string();
    assert!(
        text.contains("broken.yaml") && text.contains("job.iteration_secs"),
        "{text}"
    );
    let missing = Scenario::load(Path::new("/nonexistent/x.yaml"))
        .expect_err("missing")
        .to_string();
    assert!(missing.contains("/nonexistent/x.yaml"), "{missing}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The scenarios `warden loadgen` is measured with (`sim/load/`, docs/OPERATIONS.md)
/// load as they are written.
#[test]
fn the_load_scenarios_parse() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("load");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).expect("sim/load") {
        let path = e.expect("an entry").path();
        if path.extension().is_some_and(|x| x == "yaml") {
            let s = Scenario::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(
                s.ranks() >= 16_384,
                "{}: {} ranks",
                path.display(),
                s.ranks()
            );
            n += 1;
        }
    }
    assert!(n >= 3, "{n} load scenarios in {}", dir.display());
}
