//! Writes the seed corpora under `fuzz/corpus/<target>/` (`scripts/fuzz seeds`): wire
//! batches encoded by the real encoder (binary, sealed and JSON), API requests in the
//! `api` target's input format, NCCL plugin programs, and text seeds taken from the
//! repository: the shipped rule, preset, XID and policy files, the deployment configs,
//! the failure-log corpus excerpts (when `/work/shared/corpus` or `WARDEN_CORPUS` is
//! there) and the lines the crates' own tests use.
//!
//! The seeds are deterministic; the directories are emptied first, so what is committed
//! is exactly what this writes (plus `regression-*` files, which are kept: inputs that
//! once crashed a target).

use std::fs;
use std::path::{Path, PathBuf};

use warden_model::wire::{
    Batch, CollOp, CollectiveEvent, CommInfo, EventSeverity, GpuSample, Heartbeat, JobSignals,
    LogRecord, LogStream, NodeEvent, NodeEventKind, ProcessState, RankInfo, TrainingMetric,
    frame_sealed,
};

const T0: i64 = 1_800_000_000_000_000_000;

struct Seeds {
    root: PathBuf,
}

impl Seeds {
    /// Empty `target`'s seed directory, keeping regression inputs.
    fn clear(&self, target: &str) {
        let dir = self.root.join(target);
        fs::create_dir_all(&dir).expect("make the seed directory");
        for e in fs::read_dir(&dir)
            .expect("read the seed directory")
            .flatten()
        {
            let name = e.file_name();
            if !name.to_string_lossy().starts_with("regression-") {
                fs::remove_file(e.path()).expect("remove an old seed");
            }
        }
    }

    fn put(&self, target: &str, name: &str, bytes: &[u8]) {
        let name: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        fs::write(self.root.join(target).join(name), bytes).expect("write a seed");
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> String {
    fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

/// String literals of the test module of a source file that hold one of `needles`.
fn test_literals(rel: &str, needles: &[&str]) -> Vec<String> {
    let src = read(rel);
    let tests = src.find("#[cfg(test)]").map_or("", |i| &src[i..]);
    let mut out = Vec::new();
    let mut rest = tests;
    while let Some(i) = rest.find('"') {
        let after = &rest[i + 1..];
        let mut end = None;
        let mut escaped = false;
        for (j, c) in after.char_indices() {
            match c {
                '\\' if !escaped => escaped = true,
                '"' if !escaped => {
                    end = Some(j);
                    break;
                }
                _ => escaped = false,
            }
        }
        let Some(end) = end else { break };
        let lit = after[..end]
            .replace("\\n", "\n")
            .replace("\\t", "\t")
            .replace("\\\"", "\"")
            .replace("\\\\", "\\");
        if lit.len() >= 16 && needles.iter().any(|n| lit.contains(n)) {
            out.push(lit);
        }
        rest = &after[end + 1..];
    }
    out.sort();
    out.dedup();
    out
}

/// The excerpts of the failure-log corpus, when it is there.
fn corpus_excerpts() -> Vec<String> {
    let path = std::env::var("WARDEN_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from("/work/shared/corpus/failure-logs-dev.jsonl"));
    let Ok(text) = fs::read_to_string(&path) else {
        eprintln!(
            "no failure-log corpus at {}; its excerpts are left out",
            path.display()
        );
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get("excerpt")?.as_str().map(str::to_owned))
        .collect()
}

fn sample_batches() -> Vec<(&'static str, Batch)> {
    let heartbeat = Batch {
        version: 0,
        node: "node-01".into(),
        agent_id: "agent-1".into(),
        boot_id: "boot-1".into(),
        seq: 1,
        sent_at_ns: T0,
        jobs: vec![],
        gpus: vec![],
        events: vec![],
        heartbeat: Some(Heartbeat::default()),
    };
    let comm = 0xfeed_beef_u64;
    let job = JobSignals {
        job: "llama-70b".into(),
        ranks: (0..4)
            .map(|r| RankInfo {
                rank: r,
                world_size: 4,
                pid: 100 + r,
                gpu_index: Some(r),
                gpu_uuid: format!("GPU-{r}"),
            })
            .collect(),
        comms: (0..4)
            .map(|r| CommInfo {
                comm,
                name: "dp-0".into(),
                size: 4,
                rank: r,
                comm_rank: r,
            })
            .collect(),
        collectives: (0..4)
            .map(|r| CollectiveEvent {
                comm,
                rank: r,
                seq: 7,
                op: CollOp::AllReduce as i32,
                bytes: 1 << 20,
                start_ns: T0 - 500_000_000,
                end_ns: if r == 3 { 0 } else { T0 - 400_000_000 },
                xfer_ns: 50_000_000,
            })
            .collect(),
        metrics: vec![
            TrainingMetric {
                rank: 0,
                step: 10,
                at_ns: T0 - 100,
                loss: Some(2.5),
                grad_norm: Some(1.0),
                tokens_per_s: Some(12_000.0),
                first_nonfinite_op: None,
            },
            TrainingMetric {
                rank: 1,
                step: 10,
                at_ns: T0 - 100,
                loss: Some(f64::NAN),
                grad_norm: Some(f64::INFINITY),
                tokens_per_s: None,
                first_nonfinite_op: Some(3),
            },
        ],
        processes: vec![ProcessState {
            rank: 2,
            pid: 102,
            at_ns: T0 - 50,
            alive: false,
            exit_code: Some(1),
            signal: None,
            stopped: false,
            from_log: false,
        }],
        logs: vec![LogRecord {
            rank: Some(2),
            at_ns: T0 - 60,
            stream: LogStream::Stderr as i32,
            line: "RuntimeError: CUDA error: an illegal memory access was encountered".into(),
        }],
        links: vec![],
    };
    let gpus = vec![GpuSample {
        index: 0,
        uuid: "GPU-0".into(),
        at_ns: T0,
        util_pct: 97.5,
        mem_used_bytes: 70 << 30,
        temp_c: 71.0,
        power_w: 650.0,
        throttle_reasons: 0,
        ecc_uncorrected: 0,
    }];
    let events = vec![NodeEvent {
        id: 1,
        at_ns: T0,
        kind: NodeEventKind::Xid as i32,
        severity: EventSeverity::Fatal as i32,
        gpu_index: Some(0),
        pci_bus_id: "0000:3b:00".into(),
        code: Some(79),
        message: "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.".into(),
        count: 3,
    }];
    vec![
        ("heartbeat", heartbeat.clone()),
        (
            "job",
            Batch {
                seq: 2,
                jobs: vec![job],
                ..heartbeat.clone()
            },
        ),
        (
            "gpus-events",
            Batch {
                seq: 3,
                gpus,
                events,
                heartbeat: Some(Heartbeat {
                    dropped_records: 5,
                    failed_batches: 1,
                    collectors_down: vec!["nvml".into()],
                }),
                ..heartbeat
            },
        ),
    ]
}

fn wire(s: &Seeds) {
    s.clear("wire");
    for (name, b) in sample_batches() {
        s.put("wire", &format!("binary-{name}"), &b.encode_binary());
        s.put("wire", &format!("json-{name}"), &b.encode_json());
        let mut sealed = Vec::new();
        frame_sealed(&b.seal(), T0 + 5, &mut sealed);
        s.put("wire", &format!("sealed-{name}"), &sealed);
        // The bare payload: the target also wraps every input in an envelope.
        s.put("wire", &format!("payload-{name}"), &b.seal());
    }
}

fn api(s: &Seeds) {
    s.clear("api");
    let put = |name: &str, route: u8, param: &[u8], body: &[u8]| {
        let mut v = vec![route];
        v.extend_from_slice(param);
        v.push(0);
        v.extend_from_slice(body);
        s.put("api", name, &v);
    };
    for (name, b) in sample_batches() {
        put(&format!("ingest-json-{name}"), 0, b"", &b.encode_json());
        put(&format!("ingest-binary-{name}"), 2, b"", &b.encode_binary());
    }
    put(
        "lifecycle-start",
        5,
        b"job-42",
        concat!(
            r#"{"event":"start","scheduler":"slurm","scheduler_job_id":"4242","#,
            r#""name":"llama","nodes":["node-1","node-2"],"ranks":16}"#
        )
        .as_bytes(),
    );
    put(
        "lifecycle-end",
        5,
        b"job-42",
        br#"{"event":"end","scheduler":"kubernetes","scheduler_job_id":"team/llama"}"#,
    );
    put("ack", 0x86, b"", br#"{"note":"looking at it"}"#);
    put("ack-empty", 0x86, b"", b"");
    put("resolve", 0x87, b"", br#"{"reason":"GPU reseated"}"#);
    put("drain", 8, b"node-3", br#"{"reason":"flaky GPU 3"}"#);
    put("undrain", 9, b"node-3", br#"{"reason":"repaired"}"#);
    put("breaker-reset", 10, b"", br#"{"reason":"storm is over"}"#);
    put(
        "incidents-query",
        11,
        b"state=open&kind=gpu_fault&limit=5",
        b"",
    );
    put("incident", 0x8c, b"", b"");
    put("ranks", 13, b"job-42", b"");
    put("actions", 14, b"limit=3", b"");
    put("nodes", 15, b"", b"");
}

fn text_with_knob(s: &Seeds, target: &str, prefix: &[u8], name: &str, text: &str) {
    let mut v = prefix.to_vec();
    v.extend_from_slice(text.as_bytes());
    s.put(target, name, &v);
}

fn kernel_lines(s: &Seeds, excerpts: &[String]) {
    s.clear("kmsg");
    let needles = [
        "NVRM",
        "mlx5",
        "AER",
        "mce:",
        "ut of memory",
        "ink down",
        "fallen off",
    ];
    let mut lines = test_literals("agent/src/kmsg.rs", &needles);
    lines.extend(test_literals("agent/src/dedup.rs", &needles));
    for e in excerpts {
        lines.extend(
            e.lines()
                .filter(|l| needles.iter().any(|n| l.contains(n)))
                .map(str::to_owned),
        );
    }
    lines.push(
        concat!(
            "6,1234,312587402,-;NVRM: Xid (PCI:0000:41:00): 48, pid='<unknown>', ",
            "name=<unknown>, An uncorrectable double bit error (DBE) has been detected"
        )
        .into(),
    );
    lines.push(
        "4,88,9120400,-,caller=T1;mlx5_core 0000:0c:00.0 ib0: Link down\n SUBSYSTEM=pci".into(),
    );
    for (i, chunk) in lines.chunks(4).enumerate() {
        text_with_knob(
            s,
            "kmsg",
            &[(i as u8) << 5],
            &format!("lines-{i}"),
            &chunk.join("\n"),
        );
    }
    for name in ["kernel-fl-0004.log", "kernel-fl-0065.log"] {
        let text = read(&format!("agent/tests/data/{name}"));
        text_with_knob(s, "kmsg", &[0x41], &format!("data-{name}"), &text);
    }
}

fn cri(s: &Seeds, excerpts: &[String]) {
    s.clear("cri");
    let mut lines = test_literals("agent/src/logs/cri.rs", &["stdout", "stderr"]);
    lines.extend(test_literals(
        "agent/src/logs/tail.rs",
        &["stdout ", "stderr "],
    ));
    for (i, e) in excerpts.iter().enumerate().take(12) {
        let mut rec = String::new();
        for (j, l) in e.lines().enumerate() {
            let stream = if j % 3 == 2 { "stdout" } else { "stderr" };
            if l.len() > 40 && j % 2 == 0 {
                let (a, b) = l.split_at(l.char_indices().nth(20).map_or(0, |(k, _)| k));
                rec.push_str(&format!(
                    "2026-11-24T05:{:02}:{:02}.{j:09}Z {stream} P {a}\n",
                    i,
                    j % 60
                ));
                rec.push_str(&format!(
                    "2026-11-24T05:{:02}:{:02}.{j:09}+00:00 {stream} F {b}\n",
                    i,
                    j % 60
                ));
            } else {
                rec.push_str(&format!(
                    "2026-11-24T05:{:02}:{:02}.{j:09}Z {stream} F {l}\n",
                    i,
                    j % 60
                ));
            }
        }
        text_with_knob(
            s,
            "cri",
            &[(i as u8) & 0x3f, 128],
            &format!("excerpt-{i}"),
            &rec,
        );
    }
    for (i, chunk) in lines.chunks(4).enumerate() {
        text_with_knob(
            s,
            "cri",
            &[2, 200],
            &format!("tests-{i}"),
            &chunk.join("\n"),
        );
    }
}

fn log_lines(s: &Seeds, excerpts: &[String]) {
    s.clear("log_metrics");
    s.clear("watchdog");
    let metric_needles = [
        "loss",
        "iteration",
        "step",
        "tokens",
        "samples",
        "grad",
        "epoch",
    ];
    let mut metrics = test_literals("agent/src/logs/extract.rs", &metric_needles);
    metrics.extend(test_literals("agent/src/logs/presets.rs", &metric_needles));
    metrics.extend(test_literals("agent/src/logs/numfield.rs", &metric_needles));
    for (i, chunk) in metrics.chunks(3).enumerate() {
        text_with_knob(
            s,
            "log_metrics",
            &[i as u8],
            &format!("tests-{i}"),
            &chunk.join("\n"),
        );
    }
    let wd_needles = [
        "NCCL work",
        "collective operation timeout",
        "lagging ranks",
        "collective",
    ];
    let mut wd = test_literals("diagnosis/src/watchdog.rs", &wd_needles);
    wd.extend(test_literals("agent/src/logs/extract.rs", &wd_needles));
    for (i, chunk) in wd.chunks(4).enumerate() {
        text_with_knob(
            s,
            "watchdog",
            &[(i as u8) | 4],
            &format!("tests-{i}"),
            &chunk.join("\n"),
        );
        text_with_knob(
            s,
            "log_metrics",
            &[0x10],
            &format!("watchdog-{i}"),
            &chunk.join("\n"),
        );
    }
    for (i, e) in excerpts.iter().enumerate() {
        text_with_knob(
            s,
            "watchdog",
            &[(i as u8) & 0x8f],
            &format!("excerpt-{i}"),
            e,
        );
        if i % 3 == 0 {
            text_with_knob(s, "log_metrics", &[1], &format!("excerpt-{i}"), e);
        }
    }
}

fn rules(s: &Seeds) {
    s.clear("rules");
    let mut names: Vec<PathBuf> = fs::read_dir(repo().join("rules/logs"))
        .expect("rules/logs")
        .flatten()
        .map(|e| e.path())
        .collect();
    names.sort();
    for p in names {
        let text = fs::read_to_string(&p).expect("a rule file");
        let stem = p
            .file_stem()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        text_with_knob(s, "rules", &[0], &format!("logs-{stem}"), &text);
    }
    text_with_knob(s, "rules", &[1], "xid", &read("rules/xid.yaml"));
    text_with_knob(
        s,
        "rules",
        &[2],
        "log-presets",
        &read("rules/log-presets.yaml"),
    );
}

fn policy(s: &Seeds) {
    s.clear("policy");
    let shipped = read("rules/policy.yaml");
    text_with_knob(s, "policy", b"", "shipped", &shipped);
    let mut with_incident = shipped.into_bytes();
    with_incident.push(0xff);
    with_incident
        .extend_from_slice(b"node-7 GPU 3: XID 48 seen 5 time(s)\ngpu_hardware_xid\nhardware");
    s.put("policy", "shipped-xid48", &with_incident);
    text_with_knob(
        s,
        "policy",
        b"",
        "repeat",
        concat!(
            "version: 1\nmax_group_nodes: 2\nrules:\n",
            "  - name: repeated-xid\n    when:\n      kind: [gpu_fault]\n      xid: [48, 79]\n",
            "      min_severity: critical\n      repeat: {count: 3, per: gpu, within: 24h}\n",
            "    then: [notify, drain, restart_job]\n",
            "  - name: diagnosed\n    when:\n      category: [nccl_timeout_hang]\n",
            "      locus: [network]\n      min_confidence: 0.5\n    then: [isolate_group]\n",
        ),
    );
}

fn configs(s: &Seeds) {
    s.clear("config");
    text_with_knob(
        s,
        "config",
        &[0],
        "slurm-controller",
        &read("deploy/slurm/controller.yaml"),
    );
    text_with_knob(
        s,
        "config",
        &[1],
        "slurm-agent",
        &read("deploy/slurm/agent.yaml"),
    );
    for (knob, file) in [
        (0u8, "deploy/kubernetes/controller-config.yaml"),
        (1u8, "deploy/kubernetes/agent-config.yaml"),
    ] {
        // The ConfigMap holds the config file as a string value.
        let doc: serde_json::Value =
            warden_model::yaml::from_str(&read(file)).expect("a ConfigMap");
        if let Some(data) = doc.get("data").and_then(|d| d.as_object()) {
            for (k, v) in data {
                if let Some(v) = v.as_str() {
                    text_with_knob(s, "config", &[knob], &format!("k8s-{k}"), v);
                }
            }
        }
    }
    let mut env = b"listen: 127.0.0.1:9460\n".to_vec();
    env.push(0xff);
    env.extend_from_slice(b"WARDEN_LISTEN=0.0.0.0:1\nWARDEN_DATA_DIR=/var/lib/warden\n");
    env.extend_from_slice(b"flag.database_url=sqlite:///tmp/w.db\n");
    let mut v = vec![0];
    v.extend_from_slice(&env);
    s.put("config", "controller-env", &v);
    let mut v = vec![1];
    v.extend_from_slice(b"node_name: gpu-1\n\xffWARDEN_NODE_NAME=node-9\n");
    v.extend_from_slice(b"WARDEN_CONTROLLER_URL=http://c:9460\nflag.listen=:9461\n");
    s.put("config", "agent-env", &v);
}

/// One `startEvent` in the `nccl_profiler` program format: type selector, parent
/// selector (`Some(i)`: the i-th handle that may parent, else null), own pid, NCCL's
/// seqNumber, names by table index, a small count, channels, peer, rank, real pointers.
fn nccl_start(ty: u8, parent: Option<u8>, func: u8, datatype: u8, count: u8) -> Vec<u8> {
    let mut v = vec![0, ty];
    match parent {
        Some(i) => v.extend([0, i]),
        None => v.push(2),
    }
    v.push(1);
    v.extend_from_slice(&41u64.to_le_bytes());
    v.extend([func, datatype, 0, count, 2]);
    v.extend_from_slice(&3i32.to_le_bytes());
    v.extend_from_slice(&0i32.to_le_bytes());
    v.extend([0, 0]);
    v
}

fn nccl(s: &Seeds) {
    s.clear("nccl_profiler");
    // init: ABI version selector (1: v5), comm hash, nodes, ranks, rank selector 2 with
    // rank 2, name "dp". Names: 24 is AllReduce, 6 Send, 18 ncclFloat32, 20 ncclBfloat16.
    let init = |version: u8| -> Vec<u8> {
        let mut v = vec![version];
        v.extend_from_slice(&0x1001u64.to_le_bytes());
        v.extend_from_slice(&1i32.to_le_bytes());
        v.extend_from_slice(&4i32.to_le_bytes());
        v.extend([2, 2, 2, b'd', b'p']);
        v
    };
    // AllReduce; its stop (enqueued); a ProxyOp under it; the ProxyOp's stop (completed).
    let mut coll = vec![0];
    coll.extend(init(1));
    coll.extend(nccl_start(0, None, 24, 18, 200));
    coll.extend([4, 0]);
    coll.extend(nccl_start(3, Some(0), 0, 0, 0));
    coll.extend([4, 0]);
    s.put("nccl_profiler", "v5-allreduce-proxyop", &coll);
    // A send, a KernelCh under it, a state record, both stops (v6).
    let mut p2p = vec![1];
    p2p.extend(init(2));
    p2p.extend(nccl_start(2, None, 6, 20, 100));
    p2p.extend(nccl_start(5, Some(0), 0, 0, 0));
    p2p.extend([6, 1, 1]);
    p2p.extend_from_slice(&19i32.to_le_bytes());
    p2p.extend([4, 1, 4, 0]);
    s.put("nccl_profiler", "v6-send-kernelch", &p2p);
    // v4: an AllReduce left open, a type it does not follow, then the communicator is
    // destroyed and a new one starts.
    let mut v4 = vec![2];
    v4.extend(init(0));
    v4.extend(nccl_start(0, None, 24, 18, 8));
    v4.extend(nccl_start(6, None, 0, 0, 0));
    v4.push(7);
    v4.extend(init(0));
    v4.extend(nccl_start(0, None, 24, 18, 8));
    s.put("nccl_profiler", "v4-reinit", &v4);
    s.put(
        "nccl_profiler",
        "segment",
        &[6, 1, 0, 0, 0x10, 0, 4, 1, 2, 3, 4],
    );
    s.put(
        "nccl_profiler",
        "config",
        concat!(
            "\x07WARDEN_NCCL_PROFILER_MASK=default+kernelch\n",
            "RANK=3\nLOCAL_RANK=1\nWORLD_SIZE=16\nSLURM_JOB_ID=4242"
        )
        .as_bytes(),
    );
}

/// Choice streams for the hostile-batch target: all zeros (small names and ranks), all
/// ones (the top ranks and longest names), and a counting stream that mixes them.
fn hostile(s: &Seeds) {
    s.clear("hostile");
    s.put("hostile", "zeros", &[0u8; 512]);
    s.put("hostile", "ones", &[0xffu8; 512]);
    let counting: Vec<u8> = (0..2048u32).map(|i| (i * 37 % 251) as u8).collect();
    s.put("hostile", "counting", &counting);
    let top: Vec<u8> = (0..1024u32)
        .map(|i| if i % 3 == 0 { 1 } else { (i % 7) as u8 })
        .collect();
    s.put("hostile", "top-ranks", &top);
}

fn main() {
    let s = Seeds {
        root: Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus"),
    };
    let excerpts = corpus_excerpts();
    wire(&s);
    hostile(&s);
    api(&s);
    kernel_lines(&s, &excerpts);
    cri(&s, &excerpts);
    log_lines(&s, &excerpts);
    rules(&s);
    policy(&s);
    configs(&s);
    nccl(&s);
    println!("seeds written under {}", s.root.display());
}
