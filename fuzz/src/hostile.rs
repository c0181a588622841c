//! Fuzz target: hostile-but-valid batches, as a holder of the agents' token could send
//! them, applied to a real engine (`warden_engine::Engine`) with detector passes between
//! them. Every batch is built from the input to pass the wire's own validation, with the
//! numbers and names pushed to their edges: ranks and world sizes up to the wire's
//! bounds, many jobs, communicators, members and GPU codes, long names and lines,
//! non-finite metrics, clocks far off.
//!
//! Checked: nothing panics; everything the engine holds stays within its bounds
//! (`Engine::held` within `Engine::limits`, so memory is bounded by the bounds and not
//! by any number a client sends); every node name the engine holds or an incident names
//! is one an agent address may be made from (a DNS-1123 name), and the address made from
//! it (`HttpLogSource::base` on the default template) has exactly that host, port 9461
//! and no path, query or user part; a name that is not one makes no address.

use std::time::Duration;

use warden_controller::diagnosis::HttpLogSource;
use warden_engine::state::Limits;
use warden_engine::{Engine, EngineConfig};
use warden_model::Timestamp;
use warden_model::wire::{
    Batch, CollectiveEvent, CommInfo, Heartbeat, JobSignals, LogRecord, MAX_OP_INDEX, MAX_RANK,
    MAX_WORLD_SIZE, NodeEvent, ProcessState, RankInfo, TrainingMetric,
};

/// Reads the input as a stream of choices; zeros once it runs out.
struct Choices<'a>(&'a [u8]);

impl Choices<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) << 32 | u64::from(self.u32())
    }
    fn done(&self) -> bool {
        self.0.is_empty()
    }
    /// A rank: small, near the top, or anywhere below the wire's bound.
    fn rank(&mut self) -> u32 {
        match self.byte() % 4 {
            0 => u32::from(self.byte() % 8),
            1 => MAX_RANK - 1 - u32::from(self.byte()),
            _ => self.u32() % MAX_RANK,
        }
    }
    /// A DNS-1123 node name, short or at the 253-byte edge.
    fn node(&mut self) -> String {
        match self.byte() % 4 {
            0 => format!("node-{}", self.byte() % 16),
            1 => {
                let label = |c: char| std::iter::repeat_n(c, 63).collect::<String>();
                format!(
                    "{}.{}.{}.{}",
                    label('a'),
                    label('b'),
                    label('c'),
                    "d".repeat(61)
                )
            }
            _ => format!("n{}", self.u32()),
        }
    }
    /// A job name without control characters, up to 253 bytes.
    fn job(&mut self) -> String {
        match self.byte() % 3 {
            0 => format!("job-{}", self.byte() % 8),
            1 => "j/ ?#%".repeat(42).chars().take(253).collect(),
            _ => format!("j{}", self.u64()),
        }
    }
    fn float(&mut self) -> f64 {
        [f64::NAN, f64::INFINITY, -f64::INFINITY, 0.0, 1e308, -1.0][usize::from(self.byte() % 6)]
    }
}

const T0: i64 = 1_767_225_600_000_000_000;

fn batch(c: &mut Choices, seq: u64) -> Batch {
    let node = c.node();
    let mut jobs = Vec::new();
    for _ in 0..(c.byte() % 4) {
        let mut js = JobSignals {
            job: c.job(),
            ..JobSignals::default()
        };
        for _ in 0..(c.byte() % 16) {
            let rank = c.rank();
            let world = match c.byte() % 3 {
                0 => 0,
                1 => MAX_WORLD_SIZE,
                _ => rank + 1 + c.u32() % (MAX_WORLD_SIZE - rank),
            };
            js.ranks.push(RankInfo {
                rank,
                world_size: world,
                pid: c.u32(),
                gpu_index: Some(u32::from(c.byte() % 64)),
                gpu_uuid: String::new(),
            });
            let comm = c.u64();
            js.comms.push(CommInfo {
                comm,
                name: "c".repeat(usize::from(c.byte() % 129)),
                size: MAX_WORLD_SIZE,
                rank,
                comm_rank: c.u32() % MAX_WORLD_SIZE,
            });
            let seq = 1 + c.u64() % (1 << 40);
            let start = T0 + i64::from(c.u32());
            js.collectives.push(CollectiveEvent {
                comm,
                rank,
                seq,
                op: i32::from(c.byte()),
                bytes: c.u64(),
                start_ns: start,
                end_ns: if c.byte().is_multiple_of(2) {
                    0
                } else {
                    start + 1
                },
                xfer_ns: c.u64() >> 1,
            });
            js.metrics.push(TrainingMetric {
                rank,
                step: c.u64(),
                at_ns: T0,
                loss: Some(c.float()),
                grad_norm: Some(c.float()),
                tokens_per_s: None,
                first_nonfinite_op: (c.byte().is_multiple_of(2))
                    .then(|| c.u32() % (MAX_OP_INDEX + 1)),
            });
            js.processes.push(ProcessState {
                rank,
                pid: c.u32(),
                at_ns: T0,
                alive: c.byte().is_multiple_of(2),
                exit_code: Some(c.u32() as i32),
                signal: None,
                stopped: c.byte().is_multiple_of(2),
                from_log: false,
            });
            js.logs.push(LogRecord {
                rank: Some(rank),
                at_ns: T0,
                stream: 0,
                line: format!(
                    "Traceback error {} connection closed by peer",
                    "x".repeat(usize::from(c.byte()) * 16)
                ),
            });
        }
        jobs.push(js);
    }
    let events = (0..(c.byte() % 8))
        .map(|_| NodeEvent {
            id: c.u64(),
            at_ns: T0,
            kind: i32::from(c.byte() % 8),
            severity: i32::from(c.byte() % 4),
            gpu_index: Some(u32::from(c.byte() % 64)),
            pci_bus_id: String::new(),
            code: Some(c.u32()),
            message: "Xid".into(),
            count: c.u32(),
        })
        .collect();
    Batch {
        version: 0,
        node,
        agent_id: "a".into(),
        boot_id: format!("b{}", c.byte() % 2),
        seq,
        sent_at_ns: T0 + i64::from(c.u32()),
        heartbeat: Some(Heartbeat::default()),
        events,
        jobs,
        ..Batch::default()
    }
}

/// Small bounds, so that an input reaches them.
const LIMITS: Limits = Limits {
    max_jobs: 16,
    max_ranks: 256,
    max_nodes: 32,
    max_comms_per_job: 64,
    max_comms_per_rank: 4,
    max_codes_per_gpu: 4,
    max_state_bytes: 1 << 20,
};

/// One input, as libFuzzer passes it (`fuzz_targets/hostile.rs`).
pub fn run(data: &[u8]) {
    let mut c = Choices(data);
    let mut engine = Engine::new(
        EngineConfig {
            limits: LIMITS,
            ..EngineConfig::default()
        },
        Timestamp(T0),
    );
    let source = HttpLogSource::new("http://{node}:9461", None, Duration::from_secs(1));
    let mut seq = 0;
    while !c.done() && seq < 64 {
        seq += 1;
        let b = batch(&mut c, seq);
        // Built to pass the wire's validation; the binary form is what agents send.
        let Ok(b) = Batch::decode_binary(&b.encode_binary()) else {
            continue;
        };
        let now = Timestamp(T0 + seq as i64 * 1_000_000_000);
        engine.apply(b, now);
        engine.tick(now);
        let held = engine.held();
        assert!(
            held.within(engine.limits()),
            "{held:?} past {:?}",
            engine.limits()
        );
    }
    let names: Vec<String> = engine
        .agents(Timestamp(T0))
        .into_iter()
        .map(|(n, _)| n)
        .chain(engine.incidents().iter().flat_map(|i| i.nodes.clone()))
        .collect();
    for n in names {
        let base = source
            .base(&n)
            .expect("a held node name makes an agent address");
        let uri: axum::http::Uri = base.parse().expect("the address parses");
        assert_eq!(uri.host(), Some(n.as_str()), "{base}");
        assert_eq!(uri.port_u16(), Some(9461), "{base}");
        assert!(
            uri.query().is_none() && matches!(uri.path(), "" | "/"),
            "{base}"
        );
        assert!(!base.contains('@'), "{base}");
    }
    // A name that is not a DNS-1123 name makes no address.
    let raw = String::from_utf8_lossy(data);
    if warden_model::ids::check_node_name(&raw).is_err() {
        assert!(source.base(&raw).is_err(), "{raw:?}");
    }
}
