//! Writes random scenarios that nobody tuned for, to check detection on unseen ones:
//! `cargo run --release -p warden-sim --example random -- DIR [COUNT] [SEED]`, then
//! `cargo run --release -p warden-sim --example suite -- DIR`.
//!
//! Sizes 8 to 512 ranks, 1 to 8 GPUs per node, every parallelism that fits, iterations
//! of 0.5 to 6 s, half of them with heavy noise; a third have no fault, the rest one
//! fault of any kind or a mix ending in a stopping fault.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn pick<T: Copy>(rng: &mut SmallRng, v: &[T]) -> T {
    v[rng.random_range(0..v.len())]
}

fn fault(rng: &mut SmallRng, kind: &str, step: u64, nodes: u32, gpn: u32) -> String {
    let width = (nodes - 1).to_string().len().max(2);
    let node = format!("node-{:0width$}", rng.random_range(0..nodes));
    let rank = rng.random_range(0..nodes * gpn);
    match kind {
        "straggler" => format!(
            "{{step: {step}, kind: straggler, node: {node}, slowdown: {}}}",
            pick(rng, &[1.1, 1.3, 1.5])
        ),
        "slow_link" => format!(
            "{{step: {step}, kind: slow_link, node: {node}, slowdown: {}}}",
            pick(rng, &[2.0, 3.0])
        ),
        "xid" => format!(
            "{{step: {step}, kind: xid, node: {node}, gpu: {}, code: {}}}",
            rng.random_range(0..gpn),
            pick(rng, &[63, 92, 48, 79, 94, 119])
        ),
        other => format!("{{step: {step}, kind: {other}, rank: {rank}}}"),
    }
}

fn scenario(seed: u64) -> (String, String) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let gpn = pick(&mut rng, &[1, 2, 4, 8, 8]);
    let nodes = pick(&mut rng, &[8, 16, 32, 64]);
    let world = nodes * gpn;
    let tps: Vec<u32> = [1, 2, 4, 8]
        .into_iter()
        .filter(|t| world % t == 0 && *t <= gpn * 2)
        .collect();
    let tp = pick(&mut rng, &tps);
    let pps: Vec<u32> = [1, 2, 4]
        .into_iter()
        .filter(|p| (world / tp) % p == 0)
        .collect();
    let pp = pick(&mut rng, &pps);
    let dp = world / tp / pp;
    let iteration = pick(&mut rng, &[0.5, 0.8, 1.0, 1.5, 2.0, 3.0, 6.0]);
    let heavy = rng.random_bool(0.5);
    let jitter = if heavy {
        0.08
    } else {
        pick(&mut rng, &[0.0, 0.02, 0.05, 0.08])
    };
    let noise = if heavy {
        format!(
            "{{checkpoint_every_steps: {}, checkpoint_secs: {}, hiccup_prob: 0.03, hiccup_secs: 1.0, clock_skew_ms: 150, batch_drop_prob: 0.02}}",
            pick(&mut rng, &[0, 50, 100]),
            pick(&mut rng, &[10, 20, 30])
        )
    } else {
        format!(
            "{{checkpoint_every_steps: {}, checkpoint_secs: {}, hiccup_prob: {}, hiccup_secs: {}, clock_skew_ms: {}, batch_drop_prob: {}}}",
            pick(&mut rng, &[0, 50, 100]),
            pick(&mut rng, &[10, 20, 30]),
            pick(&mut rng, &[0.0, 0.005, 0.01]),
            pick(&mut rng, &[0.2, 0.5]),
            pick(&mut rng, &[0, 5, 40]),
            pick(&mut rng, &[0.0, 0.005])
        )
    };
    let steps: u64 = pick(&mut rng, &[200, 300, 400]);
    let mut kinds = vec![
        "none",
        "none",
        "none",
        "straggler",
        "nan",
        "xid",
        "hang",
        "crash",
        "mixed",
    ];
    if tp < world {
        kinds.push("slow_link");
    }
    let kind = pick(&mut rng, &kinds);
    let mut faults = Vec::new();
    match kind {
        "none" => {}
        "mixed" => {
            let first = pick(&mut rng, &["straggler", "nan", "slow_link"]);
            let first = if first == "slow_link" && tp == world {
                "straggler"
            } else {
                first
            };
            faults.push(fault(&mut rng, first, 60, nodes, gpn));
            let last = pick(&mut rng, &["hang", "crash", "xid"]);
            faults.push(fault(&mut rng, last, 180, nodes, gpn));
        }
        k => {
            let step = rng.random_range(40..steps - 40);
            faults.push(fault(&mut rng, k, step, nodes, gpn));
        }
    }
    let mut y = String::new();
    let _ = writeln!(y, "seed: {seed}");
    let _ = writeln!(
        y,
        "job: {{name: r{seed}, nodes: {nodes}, gpus_per_node: {gpn}, parallelism: {{tp: {tp}, pp: {pp}, dp: {dp}}}, iteration_secs: {iteration}, jitter: {jitter}}}"
    );
    let _ = writeln!(y, "noise: {noise}");
    let _ = writeln!(y, "steps: {steps}");
    if !faults.is_empty() {
        let _ = writeln!(y, "faults:");
        for f in faults {
            let _ = writeln!(y, "  - {f}");
        }
    }
    (format!("r{seed:05}-{kind}.yaml"), y)
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(dir) = args.next().map(PathBuf::from) else {
        eprintln!("usage: random DIR [COUNT] [SEED]");
        return ExitCode::from(64);
    };
    let count: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(50);
    let seed: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(1);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("error: {}: {e}", dir.display());
        return ExitCode::from(73);
    }
    for s in seed..seed + count {
        let (name, text) = scenario(s);
        if let Err(e) = std::fs::write(dir.join(&name), text) {
            eprintln!("error: {name}: {e}");
            return ExitCode::from(73);
        }
    }
    println!("wrote {count} scenarios to {}", dir.display());
    ExitCode::SUCCESS
}
