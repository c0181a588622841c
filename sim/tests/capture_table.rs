//! Holds the simulator to the table "What each path emits" in docs/CAPTURE.md: what
//! each capture path's agents send, checked on decoded batches of a small run per path.

use std::collections::HashMap;
use std::path::Path;

use warden_engine::IncidentChange;
use warden_model::Timestamp;
use warden_model::wire::{Batch, CollOp, CollectiveEvent, LinkSample};
use warden_sim::agent::{SEGMENT_POLL_SECS, TORCH_READ_SECS};
use warden_sim::{Capture, RunOptions, Scenario, Simulation, Sink};

#[derive(Default)]
struct Recorder {
    batches: Vec<Batch>,
}

impl Sink for Recorder {
    fn deliver(&mut self, body: &[u8], _now: Timestamp) {
        self.batches
            .push(Batch::decode_binary(body).expect("the simulator emits valid batches"));
    }

    fn tick(&mut self, _now: Timestamp) -> Vec<IncidentChange> {
        vec![]
    }
}

/// The table between the `capture-table` markers: signal → its cells, one per path in
/// [`Capture::ALL`]'s order.
fn table() -> HashMap<String, Vec<String>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/CAPTURE.md");
    let text = std::fs::read_to_string(&path).expect("docs/CAPTURE.md");
    let start = text.find("<!-- capture-table -->").expect("start marker");
    let end = text.find("<!-- /capture-table -->").expect("end marker");
    let mut rows = HashMap::new();
    for line in text[start..end].lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<String> = line
            .trim_matches('|')
            .split(" | ")
            .map(|c| c.trim().to_owned())
            .collect();
        if cells[0] == "signal" {
            let paths: Vec<&str> = cells[1..]
                .iter()
                .map(|c| c.split('`').nth(1).unwrap_or(""))
                .collect();
            let want: Vec<&str> = Capture::ALL.iter().map(|c| c.label()).collect();
            assert_eq!(paths, want, "the table's columns are the paths, in order");
            continue;
        }
        if !cells[0].starts_with("---") {
            assert_eq!(cells.len(), 1 + Capture::ALL.len(), "row {:?}", cells[0]);
            rows.insert(cells[0].clone(), cells[1..].to_vec());
        }
    }
    for signal in [
        "start",
        "end across nodes",
        "end inside a node",
        "transfer time across nodes",
        "transfer time inside a node",
        "per-peer wire time",
        "read by the agent",
        "point-to-point",
        "exits",
        "slow link localized",
    ] {
        assert!(rows.contains_key(signal), "the table has no row {signal:?}");
    }
    rows
}

fn cell(rows: &HashMap<String, Vec<String>>, signal: &str, c: Capture) -> String {
    let i = Capture::ALL
        .iter()
        .position(|&x| x == c)
        .expect("a path of ALL");
    rows[signal][i].clone()
}

/// A small job with a pipeline across nodes and tensor parallelism inside them.
fn run(capture: Capture) -> Vec<Batch> {
    let yaml = format!(
        "seed: 3\njob: {{name: table, nodes: 4, gpus_per_node: 4, parallelism: {{tp: 2, pp: 2, dp: 4}}, iteration_secs: 0.5}}\n\
         noise: {{clock_skew_ms: 0}}\ncapture: {}\nsteps: 40\n",
        capture.label()
    );
    let scenario = Scenario::from_yaml(&yaml, "table").expect("valid scenario");
    let mut sim = Simulation::new(&scenario, RunOptions::default());
    let mut rec = Recorder::default();
    sim.run_to_end(&mut rec);
    rec.batches
}

#[test]
fn the_simulator_emits_what_the_capture_table_says() {
    let rows = table();
    for capture in Capture::ALL {
        let label = capture.label();
        let batches = run(capture);
        // Who is where, and which communicators stay inside a node.
        let mut node_of: HashMap<u32, String> = HashMap::new();
        let mut members: HashMap<u64, Vec<u32>> = HashMap::new();
        let mut names: HashMap<u64, (String, u32)> = HashMap::new();
        for b in &batches {
            for j in &b.jobs {
                for r in &j.ranks {
                    node_of.insert(r.rank, b.node.clone());
                }
                for c in &j.comms {
                    let m = members.entry(c.comm).or_default();
                    if !m.contains(&c.rank) {
                        m.push(c.rank);
                    }
                    names.insert(c.comm, (c.name.clone(), c.size));
                }
            }
        }
        let inside = |comm: u64| {
            let m = &members[&comm];
            m.iter().all(|r| node_of.get(r) == node_of.get(&m[0]))
        };
        let completed: Vec<&CollectiveEvent> = batches
            .iter()
            .flat_map(|b| b.jobs.iter().flat_map(|j| j.collectives.iter()))
            .filter(|c| c.end_ns != 0)
            .collect();
        assert!(!completed.is_empty());
        let (ins, across): (Vec<&CollectiveEvent>, Vec<&CollectiveEvent>) =
            completed.iter().partition(|c| inside(c.comm));
        assert!(!ins.is_empty() && !across.is_empty(), "{label}");

        // The end inside a node.
        let end_inside = cell(&rows, "end inside a node", capture);
        if end_inside.contains("enqueue") {
            assert!(
                ins.iter().all(|c| c.end_ns - c.start_ns <= 100_000),
                "{label}: an end inside a node later than the enqueue"
            );
        } else {
            assert!(end_inside.contains("is_completed()") && end_inside.contains("20 ms"));
            assert!(
                ins.iter().any(|c| c.end_ns - c.start_ns > 1_000_000),
                "{label}: no end inside a node shows a wait"
            );
            let grid = (TORCH_READ_SECS * 1e9) as i64;
            for c in &ins {
                let phase = i64::from(c.rank % 50) * grid / 50;
                let off = (c.end_ns - warden_sim::SIM_EPOCH.nanos() - phase).rem_euclid(grid);
                assert!(
                    off < 1_000 || grid - off < 1_000,
                    "{label}: an end off the 20 ms poll"
                );
            }
        }
        // Transfer times.
        for (signal, set) in [
            ("transfer time across nodes", &across),
            ("transfer time inside a node", &ins),
        ] {
            let none = cell(&rows, signal, capture) == "none";
            let any = set.iter().any(|c| c.xfer_ns > 0);
            assert_eq!(any, !none, "{label}: {signal}");
        }
        // Read interval: the simulator's constants are the table's.
        let read = cell(&rows, "read by the agent", capture);
        let want = match capture {
            Capture::Nccl | Capture::NcclProxy => {
                format!(
                    "every {} s and just before each batch is cut",
                    SEGMENT_POLL_SECS
                )
            }
            Capture::Torch => format!("every {} ms", (TORCH_READ_SECS * 1e3).round()),
        };
        assert!(read.starts_with(&want), "{label}: {read:?} is not {want:?}");
        if read.contains("before each batch is cut") {
            // A batch holds every completion stamped before its cut: nothing it shows in
            // flight had ended by then.
            let end: HashMap<(u64, u32, u64), i64> = completed
                .iter()
                .map(|c| ((c.comm, c.rank, c.seq), c.end_ns))
                .collect();
            for b in &batches {
                for c in b.jobs.iter().flat_map(|j| &j.collectives) {
                    if let Some(&e) = end.get(&(c.comm, c.rank, c.seq)).filter(|_| c.end_ns == 0) {
                        assert!(
                            e > b.sent_at_ns,
                            "{label}: {} seq {} of rank {} in flight in a batch cut {} ns after it ended",
                            c.comm,
                            c.seq,
                            c.rank,
                            b.sent_at_ns - e
                        );
                    }
                }
            }
        }
        // Point-to-point traffic, on pair communicators named as the path names them.
        let p2p = cell(&rows, "point-to-point", capture);
        let prefix = p2p
            .trim_matches('`')
            .split('<')
            .next()
            .expect("a name pattern")
            .to_owned();
        let mut pairs = 0;
        for c in &completed {
            let op = CollOp::from_wire(c.op);
            assert_ne!(
                op,
                CollOp::SendRecv,
                "{label}: a pipeline exchange as a collective"
            );
            if matches!(op, CollOp::Send | CollOp::Recv) {
                let (name, size) = &names[&c.comm];
                assert!(
                    name.starts_with(&prefix) && name.contains(":p2p:") && *size == 2,
                    "{label}: {name} of {size}"
                );
                pairs += 1;
            }
        }
        assert!(pairs > 0, "{label}: no point-to-point traffic");
        // Per-peer wire time: totals per (communicator, sender, receiver) that never go
        // down, only on edges between nodes.
        let wire = cell(&rows, "per-peer wire time", capture);
        let samples: Vec<&LinkSample> = batches
            .iter()
            .flat_map(|b| b.jobs.iter().flat_map(|j| j.links.iter()))
            .collect();
        assert_eq!(
            samples.is_empty(),
            wire == "none",
            "{label}: per-peer wire time"
        );
        let mut comm_ranks: HashMap<(u64, u32), u32> = HashMap::new();
        for b in &batches {
            for j in &b.jobs {
                for c in &j.comms {
                    comm_ranks.insert((c.comm, c.comm_rank), c.rank);
                }
                for l in &j.links {
                    comm_ranks.insert((l.comm, l.comm_rank), l.rank);
                }
            }
        }
        let mut last: HashMap<(u64, u32, u32), (u64, u64, u64)> = HashMap::new();
        for l in &samples {
            let dst = comm_ranks[&(l.comm, l.peer)];
            assert_ne!(
                node_of[&l.rank], node_of[&dst],
                "{label}: an edge inside a node"
            );
            let now = (l.steps, l.bytes, l.busy_ns);
            let before = last
                .insert((l.comm, l.rank, l.peer), now)
                .unwrap_or_default();
            assert!(
                now.0 > before.0 && now.1 > before.1 && now.2 > before.2,
                "{label}: totals that did not grow"
            );
        }
        // Links.
        let links = cell(&rows, "slow link localized", capture);
        assert_eq!(links == "yes", capture.sees_links(), "{label}");
    }
}
