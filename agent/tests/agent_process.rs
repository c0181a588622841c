//! The `warden-agent` binary on a node of 8 fake GPUs (the fake `libnvidia-ml.so.1`
//! loaded through the real NVML path): what it exports on `/metrics` and what it ships
//! match what the GPUs report, including an XID from NVML's event set and an ECC jump.

use std::time::Duration;

use warden_model::wire::{Batch, EventSeverity, NodeEventKind};
use warden_testkit::PATIENCE;

#[path = "fake_nvml/mod.rs"]
mod fake_nvml;
mod support;
use support::{AgentProc, Sink, free_port, http_get, metric};

fn config(
    dir: &std::path::Path,
    lib: &std::path::Path,
    agent: u16,
    controller: u16,
) -> std::path::PathBuf {
    let kmsg = dir.join("kern.log");
    std::fs::write(&kmsg, "").expect("kernel log");
    let boot = dir.join("boot_id");
    std::fs::write(&boot, "boot-7\n").expect("boot id");
    let path = dir.join("agent.yaml");
    std::fs::write(
        &path,
        format!(
            "node_name: gpu-node-3\nlisten: 127.0.0.1:{agent}\n\
             controller:\n  url: http://127.0.0.1:{controller}\n  flush_interval_ms: 200\n\
             nvml:\n  library: {}\n  interval_ms: 200\n  dcgm_compat: true\n\
             kmsg:\n  path: {}\n  boot_id_path: {}\n\
             capture:\n  socket: {}\n",
            lib.display(),
            kmsg.display(),
            boot.display(),
            dir.join("capture.sock").display()
        ),
    )
    .expect("config");
    path
}

fn events(batches: &[Batch], kind: NodeEventKind) -> Vec<warden_model::wire::NodeEvent> {
    batches
        .iter()
        .flat_map(|b| b.events.iter())
        .filter(|e| NodeEventKind::from_wire(e.kind) == kind)
        .cloned()
        .collect()
}

#[test]
fn fake_gpus_are_exported_and_shipped() {
    let node = fake_nvml::FakeNode::new(&[]);
    node.set("gpu.*.temp", 51);
    node.set("gpu.5.temp", 66);
    // GPM support is asked once per GPU, as it cannot change while the driver runs.
    node.set("gpu.2.gpm", 1);
    node.set("gpu.2.gpm_tensor_util", 42);
    node.set("gpu.2.gpm_sm_util", 80);
    node.set("gpu.2.gpm_pcie_tx", 3);
    let dir = tempfile::tempdir().expect("tempdir");
    let (agent_port, controller_port) = (free_port(), free_port());
    let sink = Sink::start(controller_port);
    let cfg = config(dir.path(), node.lib_path(), agent_port, controller_port);
    let mut agent = AgentProc::start(&cfg, agent_port);

    // Eight GPUs sampled and shipped. The collector sets its gauges before it queues
    // the samples, so the metrics already show what was shipped.
    sink.wait_for("a batch with the 8 GPU samples", |b| {
        b.iter()
            .any(|b| b.gpus.len() >= 8 && b.gpus.iter().any(|g| g.index == 5 && g.temp_c == 66.0))
    });
    let m = agent.metrics();
    assert_eq!(
        metric(&m, "warden_agent_collector_up{collector=\"nvml\"}"),
        Some(1.0),
        "{m}"
    );
    let temp5 = m
        .lines()
        .find(|l| l.starts_with("warden_gpu_temperature_celsius{") && l.contains("gpu=\"5\""))
        .expect("GPU 5 temperature exported");
    assert!(temp5.ends_with(" 66"), "{temp5}");
    assert!(
        m.contains("DCGM_FI_DEV_GPU_TEMP{"),
        "dcgm-exporter names exported"
    );

    // GPM on GPU 2 (a Hopper GPU's profiling metrics): from its second sample on, its
    // DCGM_FI_PROF_* and warden_gpu_*_active series are there; GPU 5 has none.
    let series = |m: &str, name: &str, gpu: &str| {
        m.lines()
            .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(&format!("gpu=\"{gpu}\"")))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    let m = agent.wait_metrics("GPM readings of GPU 2", |m| {
        series(m, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "2").is_some()
    });
    assert_eq!(
        series(&m, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "2"),
        Some(0.42),
        "{m}"
    );
    assert_eq!(
        series(&m, "warden_gpu_sm_active_ratio", "2"),
        Some(0.8),
        "{m}"
    );
    assert_eq!(
        series(&m, "warden_gpu_pcie_tx_bytes_per_second", "2"),
        Some(3.0 * 1_048_576.0),
        "{m}"
    );
    assert_eq!(series(&m, "DCGM_FI_PROF_SM_ACTIVE", "5"), None, "{m}");

    // Faults: an XID through the event set, an uncorrected ECC jump, a hot GPU.
    node.set("event.1", "gpu:3,xid:79");
    node.set("gpu.2.ecc_unc_vol", 4);
    node.set("gpu.5.temp", 95);
    let got = sink.wait_for("the XID, ECC and thermal events", |b| {
        !events(b, NodeEventKind::Xid).is_empty()
            && !events(b, NodeEventKind::Ecc).is_empty()
            && !events(b, NodeEventKind::Thermal).is_empty()
    });
    let xid = &events(&got, NodeEventKind::Xid)[0];
    assert_eq!((xid.code, xid.gpu_index), (Some(79), Some(3)));
    assert_eq!(xid.severity, EventSeverity::Fatal as i32);
    assert!(
        xid.id >= 1 << 63,
        "agent-made ids are disjoint from kernel-log ids"
    );
    let ecc = &events(&got, NodeEventKind::Ecc)[0];
    assert_eq!((ecc.gpu_index, ecc.count), (Some(2), 4));
    let hot = &events(&got, NodeEventKind::Thermal)[0];
    assert_eq!(hot.gpu_index, Some(5));
    assert!(
        got.iter()
            .all(|b| b.node == "gpu-node-3" && b.boot_id == "boot-7")
    );

    // Events are counted before they are queued: the counters include what was shipped.
    let m = agent.metrics();
    assert_eq!(
        metric(&m, "warden_gpu_xid_errors_total{code=\"79\",gpu=\"3\"}"),
        None,
        "the kernel log is up, so it (not NVML) counts XIDs"
    );
    assert_eq!(
        metric(
            &m,
            "warden_node_events_total{kind=\"xid\",severity=\"fatal\"}"
        ),
        Some(1.0),
        "{m}"
    );
    // The process metrics every Prometheus client exports (CPU time in whole seconds,
    // still 0 here).
    assert!(metric(&m, "process_cpu_seconds_total").is_some(), "{m}");
    for name in [
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
    ] {
        assert!(
            metric(&m, name).is_some_and(|v| v > 0.0),
            "{name} missing or zero in: {m}"
        );
    }
    let health = http_get(agent_port, "/healthz").expect("healthz");
    assert!(health.contains("\"collectors_down\":[]"), "{health}");
    assert!(agent.alive());
}

#[test]
fn check_config_prints_a_file_that_configures_the_same_agent_and_names_each_source() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("agent.yaml");
    std::fs::write(
        &cfg,
        "node_name: gpu-node-4\ncontroller:\n  flush_interval_ms: 700\n\
         logs:\n  sources:\n    - paths: [\"/x/*.log\"]\n      format: cri\n",
    )
    .expect("config");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_warden-agent"))
        .arg("--config")
        .arg(&cfg)
        .args(["--listen", "127.0.0.1:9999", "--check-config"])
        .env("WARDEN_CONTROLLER_URL", "http://c.example:9460")
        .env_remove("NODE_NAME")
        .output()
        .expect("run the agent");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = cfg.display().to_string();
    for line in [
        format!("node_name: gpu-node-4  # from {file}"),
        "listen: 127.0.0.1:9999  # from flag --listen".to_owned(),
        "  url: http://c.example:9460  # from environment WARDEN_CONTROLLER_URL".to_owned(),
        format!("  flush_interval_ms: 700  # from {file}"),
        "  heartbeat_interval_ms: 5000  # default".to_owned(),
        format!("  sources:  # from {file}"),
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "no line {line:?} in:\n{text}"
        );
    }
    assert!(!text.contains("Duration"), "no Rust debug output: {text}");

    // The printed file, read with nothing else, is the same configuration.
    let printed = dir.path().join("printed.yaml");
    std::fs::write(&printed, text.as_bytes()).expect("write");
    let none = warden_agent::config::Overrides::default();
    let again = warden_agent::config::AgentConfig::load(Some(&printed), |_| None, &none, None)
        .expect("the printed file loads");
    let flags = warden_agent::config::Overrides {
        listen: Some("127.0.0.1:9999".to_owned()),
        ..Default::default()
    };
    let first = warden_agent::config::AgentConfig::load(
        Some(&cfg),
        |k| (k == "WARDEN_CONTROLLER_URL").then(|| "http://c.example:9460".to_owned()),
        &flags,
        None,
    )
    .expect("the original loads");
    assert_eq!(format!("{again:?}"), format!("{first:?}"));
}

#[test]
fn without_a_driver_the_agent_reports_nvml_down_and_carries_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (agent_port, controller_port) = (free_port(), free_port());
    let sink = Sink::start(controller_port);
    let missing = dir.path().join("no/libnvidia-ml.so.1");
    let cfg = config(dir.path(), &missing, agent_port, controller_port);
    let mut agent = AgentProc::start(&cfg, agent_port);
    // A collector's metric is set before it joins the list the heartbeat carries.
    sink.wait_for("a heartbeat reporting nvml down", |b| {
        b.iter().any(|b| {
            b.heartbeat
                .as_ref()
                .is_some_and(|h| h.collectors_down == ["nvml"])
        })
    });
    let m = agent.metrics();
    assert_eq!(
        metric(&m, "warden_agent_collector_up{collector=\"nvml\"}"),
        Some(0.0)
    );
    assert_eq!(metric(&m, "warden_gpu_collector_up"), Some(0.0), "{m}");
    assert_eq!(
        metric(&m, "warden_agent_collector_up{collector=\"kmsg\"}"),
        Some(1.0)
    );
    assert!(agent.alive());
}

#[test]
fn training_logs_become_metrics_notable_lines_and_a_window() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (agent_port, controller_port) = (free_port(), free_port());
    let sink = Sink::start(controller_port);
    let missing = dir.path().join("no/libnvidia-ml.so.1");
    let cfg = config(dir.path(), &missing, agent_port, controller_port);
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&logs).expect("log dir");
    let mut text = std::fs::read_to_string(&cfg).expect("config");
    text.push_str(&format!(
        "logs:\n  sources:\n    - paths: [\"{}/rank_*.log\"]\n      job: llama-70b\n  partial_flush_ms: 200\n  multiline:\n    flush_ms: 200\n",
        logs.display()
    ));
    std::fs::write(&cfg, text).expect("config");
    let agent = AgentProc::start(&cfg, agent_port);

    // A file that appears after start is read from its beginning.
    let body = "\
 iteration      100/  500000 | consumed samples:       102400 | elapsed time per iteration (ms): 412.3 | learning rate: 2.999E-04 | global batch size:  1024 | lm loss: 2.534100E+00 | loss scale: 1.0 | grad norm: 0.912 | number of skipped iterations:   0 | number of nan iterations:   0 |
 iteration      101/  500000 | consumed samples:       103424 | elapsed time per iteration (ms): 411.9 | learning rate: 2.999E-04 | global batch size:  1024 | lm loss: 2.530000E+00 | loss scale: 1.0 | grad norm: 0.905 | number of skipped iterations:   0 | number of nan iterations:   0 |
[INFO] saving nothing in particular
Traceback (most recent call last):
  File \"/workspace/train.py\", line 88, in <module>
    main()
  File \"/workspace/train.py\", line 80, in main
    loss.backward()
RuntimeError: CUDA error: an illegal memory access was encountered
";
    std::fs::write(logs.join("rank_3.log"), body).expect("log");
    // The collector handles the lines in order and holds the window's lock for the
    // whole poll: once the traceback is shipped, both metrics are counted, and a window
    // query sees every line up to it.
    let got = sink.wait_for("the two metrics and the traceback", |b| {
        let jobs = || {
            b.iter()
                .flat_map(|b| b.jobs.iter())
                .filter(|j| j.job == "llama-70b")
        };
        jobs().map(|j| j.metrics.len()).sum::<usize>() >= 2
            && jobs()
                .flat_map(|j| j.logs.iter())
                .any(|l| l.line.starts_with("Traceback"))
    });
    let job: Vec<_> = got
        .iter()
        .flat_map(|b| b.jobs.iter())
        .filter(|j| j.job == "llama-70b")
        .collect();
    let m: Vec<_> = job.iter().flat_map(|j| j.metrics.iter()).collect();
    assert_eq!((m[0].rank, m[0].step, m[0].loss), (3, 100, Some(2.5341)));
    assert_eq!(m[0].grad_norm, Some(0.912));
    let tb = job
        .iter()
        .flat_map(|j| j.logs.iter())
        .find(|l| l.line.starts_with("Traceback"))
        .expect("traceback");
    assert!(
        tb.line
            .ends_with("an illegal memory access was encountered"),
        "kept together: {}",
        tb.line
    );
    assert_eq!(tb.rank, Some(3));
    let shipped: Vec<&str> = job
        .iter()
        .flat_map(|j| j.logs.iter())
        .map(|l| l.line.as_str())
        .collect();
    assert!(
        !shipped.iter().any(|l| l.contains("saving nothing")),
        "ordinary lines stay local"
    );

    // Every line is in the local window.
    let around = tb.at_ns;
    let window = http_get(
        agent_port,
        &format!("/api/v1/logs?job=llama-70b&rank=3&around={around}&before_secs=60&after_secs=5"),
    )
    .expect("log window");
    assert!(window.contains("saving nothing in particular"), "{window}");
    assert!(window.contains("illegal memory access"), "{window}");
    let m = agent.metrics();
    assert_eq!(
        metric(&m, "warden_agent_log_metrics_total"),
        Some(2.0),
        "{m}"
    );
    assert_eq!(
        metric(&m, "warden_agent_collector_up{collector=\"logs\"}"),
        Some(1.0)
    );
}

#[test]
fn a_bad_config_names_the_field_and_exits_64_before_binding() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let cfg = dir.path().join("bad.yaml");
    std::fs::write(
        &cfg,
        format!("listen: 127.0.0.1:{port}\ncontroller:\n  flush_interval_ms: 5\nlogs:\n  sources:\n    - paths: [\"/x/*.log\"]\n      format: json\n"),
    )
    .expect("config");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_warden-agent"))
        .arg("--config")
        .arg(&cfg)
        .output()
        .expect("run the agent");
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("field `controller.flush_interval_ms`"),
        "{err}"
    );
    assert!(err.contains("logs"), "{err}");
    assert!(
        std::net::TcpListener::bind(("127.0.0.1", port)).is_ok(),
        "no port was bound"
    );

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_warden-agent"))
        .args(["--no-such-flag"])
        .output()
        .expect("run the agent");
    assert_eq!(
        out.status.code(),
        Some(64),
        "a bad flag is a configuration error too"
    );
}

/// The controller's diagnosis pulls the log window around an incident from a real agent
/// and names the failure and the rank from it; a node whose agent cannot be reached is
/// read from the lines the controller already holds.
#[test]
fn the_controller_diagnoses_from_the_agents_log_window() {
    use std::sync::Arc;
    use warden_controller::diagnosis::{Diagnoser, DiagnosisConfig, HttpLogSource};
    use warden_diagnosis::rules::RuleSet;
    use warden_engine::engine::{DiagnosisRequest, HeldLine};
    use warden_model::Timestamp;

    let dir = tempfile::tempdir().expect("tempdir");
    let (agent_port, controller_port) = (free_port(), free_port());
    let _sink = Sink::start(controller_port);
    let missing = dir.path().join("no/libnvidia-ml.so.1");
    let cfg = config(dir.path(), &missing, agent_port, controller_port);
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&logs).expect("log dir");
    let mut text = std::fs::read_to_string(&cfg).expect("config");
    text.push_str(&format!(
        "logs:\n  sources:\n    - paths: [\"{}/rank_*.log\"]\n      job: llama-70b\n  partial_flush_ms: 200\n  multiline:\n    flush_ms: 200\n",
        logs.display()
    ));
    std::fs::write(&cfg, text).expect("config");
    let _agent = AgentProc::start(&cfg, agent_port);
    std::fs::write(
        logs.join("rank_5.log"),
        "[INFO] step 1200 done\n\
Traceback (most recent call last):\n  File \"/workspace/train.py\", line 80, in main\n    loss.backward()\n\
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.50 GiB. GPU 5 has a total capacity of 79.11 GiB of which 1.02 GiB is free.\n",
    )
    .expect("log");
    std::fs::write(
        logs.join("rank_1.log"),
        "[rank1]:[E1122 10:00:00.000 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1201, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 milliseconds before timing out.\n",
    )
    .expect("log");

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let rules = Arc::new(RuleSet::builtin().expect("shipped rules"));
    let request = |held: Vec<HeldLine>| DiagnosisRequest {
        incident: "inc-1".into(),
        job: Some("llama-70b".into()),
        onset: Timestamp::from_nanos(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_nanos() as i64,
        ),
        culprit_nodes: vec!["gpu-node-3".into()],
        peer_nodes: vec![],
        world_size: Some(8),
        held,
        first_failed: vec![],
    };
    let diagnoser = |url: String| {
        let config = DiagnosisConfig {
            agent_url: url.clone(),
            ..DiagnosisConfig::default()
        };
        // A pull that times out reads nothing from the node: allow a loaded agent
        // time to answer (an agent that cannot be reached refuses at once).
        let source = Arc::new(HttpLogSource::new(&url, None, Duration::from_secs(30)));
        Diagnoser::new(config, rules.clone(), source, None)
    };

    // Wait until the agent's window holds both files' lines, the traceback flushed
    // whole, so that the diagnosis from it names the failure and its rank.
    let live = diagnoser(format!("http://127.0.0.1:{agent_port}"));
    let mut last = None;
    let found = warden_testkit::poll(PATIENCE, || {
        let d = runtime.block_on(live.diagnose(&request(vec![]), None));
        let complete = d.lines_read >= 3
            && d.category.as_deref() == Some("gpu_oom")
            && d.evidence
                .iter()
                .any(|e| e.text.contains("CUDA out of memory") && e.rank == Some(5));
        if complete {
            return Some(d);
        }
        last = Some(d);
        None
    });
    let Some(d) = found else {
        panic!("the diagnosis never read both files from the agent's window: {last:#?}");
    };
    assert_eq!(d.category.as_deref(), Some("gpu_oom"), "{d:#?}");
    assert_eq!(d.nodes_read, vec!["gpu-node-3".to_owned()]);
    assert!(d.ranks.contains(&5), "{d:#?}");
    assert!(
        d.evidence
            .iter()
            .any(|e| e.text.contains("CUDA out of memory") && e.rank == Some(5)),
        "{d:#?}"
    );

    // An agent that cannot be reached: the held lines stand in for its node.
    let dead = diagnoser(format!("http://127.0.0.1:{}", free_port()));
    let held = vec![HeldLine {
        rank: Some(2),
        node: Some("gpu-node-3".into()),
        text: "RuntimeError: CUDA error: an illegal memory access was encountered".into(),
    }];
    let d = runtime.block_on(dead.diagnose(&request(held), None));
    assert!(d.nodes_read.is_empty());
    assert_eq!(d.lines_read, 1);
    assert_eq!(d.category.as_deref(), Some("cuda_runtime_error"), "{d:#?}");

    // A reachable agent whose window lacks a line the controller holds (here the
    // kernel-log line of a hardware event, which no agent window tails): it is read too.
    let window_lines = runtime
        .block_on(live.diagnose(&request(vec![]), None))
        .lines_read;
    let xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus.";
    let held = vec![HeldLine {
        rank: None,
        node: Some("gpu-node-3".into()),
        text: xid.into(),
    }];
    let d = runtime.block_on(live.diagnose(&request(held), None));
    assert_eq!(d.nodes_read, vec!["gpu-node-3".to_owned()]);
    assert_eq!(d.lines_read, window_lines + 1, "{d:#?}");
    assert!(d.evidence.iter().any(|e| e.text == xid), "{d:#?}");
}

/// Whatever the controller has received, the agent's metrics already count: the
/// kernel-log collector counts a line, its XID and its event before it queues the
/// event. The tests above wait for a batch and then read counters; this order is what
/// makes that safe.
#[test]
fn what_is_shipped_is_already_counted_in_the_metrics() {
    use std::io::Write;

    let dir = tempfile::tempdir().expect("tempdir");
    let controller = free_port();
    let sink = Sink::start(controller);
    let (cfg, port) = support::agent_config(
        dir.path(),
        "count-node",
        &format!("http://127.0.0.1:{controller}"),
        "",
    );
    let kern = dir.path().join("count-node").join("kern.log");
    let agent = AgentProc::start(&cfg, port);
    let sum = |m: &str, prefix: &str| -> f64 {
        m.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    for (i, code) in [13u32, 31, 48, 79].into_iter().enumerate() {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&kern)
            .expect("kernel log");
        writeln!(
            f,
            "[ {}.000001] NVRM: Xid (PCI:0000:3b:00): {code}, pid=4242, name=python3, fault {i}",
            100 + i
        )
        .expect("append");
        drop(f);
        let n = i + 1;
        let got = sink.wait_for(&format!("{n} XID events"), |b| {
            events(b, NodeEventKind::Xid).len() >= n
        });
        let shipped = events(&got, NodeEventKind::Xid)
            .iter()
            .filter(|e| e.count == 1)
            .count() as f64;
        let m = agent.metrics();
        assert!(
            sum(&m, "warden_node_events_total{kind=\"xid\"") >= shipped,
            "{shipped} XID events shipped:\n{m}"
        );
        assert!(
            sum(&m, "warden_gpu_xid_errors_total{") >= shipped,
            "{shipped} XID events shipped:\n{m}"
        );
        assert!(
            metric(&m, "warden_agent_kmsg_lines_total").unwrap_or(0.0) >= n as f64,
            "{n} lines written:\n{m}"
        );
    }
}

/// A wait for the agent to serve ends as soon as its process exits, naming the exit
/// status, rather than running out its whole deadline.
#[test]
fn a_wait_for_the_agent_ends_when_the_agent_exits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let cfg = dir.path().join("bad.yaml");
    std::fs::write(
        &cfg,
        format!("listen: 127.0.0.1:{port}\ncontroller:\n  flush_interval_ms: 5\n"),
    )
    .expect("config");
    let started = std::time::Instant::now();
    let failed = std::panic::catch_unwind(|| AgentProc::start(&cfg, port))
        .err()
        .expect("the wait for an agent that exited fails");
    let msg = failed.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("exited"), "{msg}");
    assert!(msg.contains("64"), "the exit status is named: {msg}");
    eprintln!("the wait ended {:?} after the start", started.elapsed());
}

/// The fake kubelet (support/fake_kubelet.py): grpcio serving the pod-resources API on
/// a unix socket from a JSON file it re-reads on every call. Killed on drop.
struct FakeKubelet(std::process::Child);

impl FakeKubelet {
    fn start(python: &std::path::Path, socket: &std::path::Path, pods: &std::path::Path) -> Self {
        use std::io::BufRead;
        let _ = std::fs::remove_file(socket);
        let mut child = std::process::Command::new(python)
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/support/fake_kubelet.py"
            ))
            .args([socket, pods])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the fake kubelet");
        let mut line = String::new();
        let out = child.stdout.take().expect("stdout");
        std::io::BufReader::new(out)
            .read_line(&mut line)
            .expect("read the fake kubelet");
        assert_eq!(line.trim(), "ready", "the fake kubelet did not start");
        FakeKubelet(child)
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The `/metrics` line of series `name` for GPU `gpu`.
fn gpu_line<'a>(m: &'a str, name: &str, gpu: u32) -> Option<&'a str> {
    m.lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(&format!("gpu=\"{gpu}\"")))
}

/// Whether GPU `gpu`'s temperature series, under both names, carries exactly the labels
/// of `pod` (namespace/pod/container).
fn labelled(m: &str, gpu: u32, pod: &str) -> bool {
    let parts: Vec<&str> = pod.split('/').collect();
    let want = [
        format!("namespace=\"{}\"", parts[0]),
        format!("pod=\"{}\"", parts[1]),
        format!("container=\"{}\"", parts[2]),
    ];
    ["warden_gpu_temperature_celsius", "DCGM_FI_DEV_GPU_TEMP"]
        .iter()
        .all(|name| {
            gpu_line(m, name, gpu).is_some_and(|l| want.iter().all(|w| l.contains(w.as_str())))
        })
}

fn write_pods(path: &std::path::Path, pods: &serde_json::Value) {
    std::fs::write(path, pods.to_string()).expect("write the pods");
}

/// Two pods holding GPUs 1 and 2 as the NVIDIA device plugin reports them: GPU 1 whole,
/// GPU 2 time-sliced (`::N` replica ids under `nvidia.com/gpu.shared`).
fn pods(gpu1_pod: (&str, &str, &str)) -> serde_json::Value {
    let uuid = |i: u32| format!("GPU-fa4e0000-0000-4000-8000-{i:012x}");
    serde_json::json!([
        {"namespace": gpu1_pod.0, "name": gpu1_pod.1, "containers": [
            {"name": "sidecar"},
            {"name": gpu1_pod.2, "cpu_ids": [4, 5],
             "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": [uuid(1)], "numa": [0]}]}]},
        {"namespace": "infer", "name": "vllm-0", "containers": [
            {"name": "engine",
             "devices": [{"resource_name": "nvidia.com/gpu.shared", "device_ids": [format!("{}::0", uuid(2))]}]}]},
        {"namespace": "net", "name": "sriov", "containers": [
            {"name": "x", "devices": [{"resource_name": "intel.com/sriov", "device_ids": [uuid(3)]}]}]},
    ])
}

/// On a Kubernetes node, every GPU series carries the pod, namespace and container the
/// kubelet assigned its GPU to (as dcgm-exporter's do), follows a reassignment, keeps
/// its labels while the kubelet errs, and the agent connects again after the kubelet
/// restarts.
#[test]
fn gpu_series_carry_the_pod_the_kubelet_assigned_their_gpu_to() {
    let Some(python) = warden_testkit::tools::venv_python("grpc") else {
        return;
    };
    let node = fake_nvml::FakeNode::new(&[]);
    let dir = tempfile::tempdir().expect("tempdir");
    let (socket, pods_file) = (
        dir.path().join("kubelet.sock"),
        dir.path().join("pods.json"),
    );
    write_pods(&pods_file, &pods(("train", "llama-0", "trainer")));
    let kubelet = FakeKubelet::start(&python, &socket, &pods_file);
    let (agent_port, controller_port) = (free_port(), free_port());
    let _sink = Sink::start(controller_port);
    let cfg = config(dir.path(), node.lib_path(), agent_port, controller_port);
    let mut text = std::fs::read_to_string(&cfg).expect("config");
    text.push_str(&format!(
        "pod_resources:\n  socket: {}\n  interval_ms: 1000\n",
        socket.display()
    ));
    std::fs::write(&cfg, text).expect("config");
    let agent = AgentProc::start(&cfg, agent_port);

    let m = agent.wait_metrics("GPU 1 labelled with its pod", |m| {
        labelled(m, 1, "train/llama-0/trainer")
    });
    assert!(
        labelled(&m, 2, "infer/vllm-0/engine"),
        "a time-sliced GPU has its pod:\n{m}"
    );
    // Another resource's device ids are not GPUs; an unassigned GPU has empty labels.
    for gpu in [3, 5] {
        let l = gpu_line(&m, "warden_gpu_temperature_celsius", gpu).expect("GPU series");
        assert!(
            l.contains("pod=\"\"") && l.contains("namespace=\"\""),
            "{l}"
        );
    }
    assert_eq!(
        metric(&m, "warden_agent_collector_up{collector=\"pod_resources\"}"),
        Some(1.0),
        "{m}"
    );

    // GPU 1 moves to another pod: its series follow, and the old pod's are gone.
    write_pods(&pods_file, &pods(("train", "llama-1", "trainer")));
    let m = agent.wait_metrics("GPU 1 relabelled", |m| {
        labelled(m, 1, "train/llama-1/trainer")
    });
    assert!(
        !m.contains("pod=\"llama-0\""),
        "the old pod's series are removed:\n{m}"
    );

    // The kubelet errs: the collector is down, the labels stay.
    write_pods(
        &pods_file,
        &serde_json::json!({"error": "kubelet is restarting"}),
    );
    let m = agent.wait_metrics("pod_resources down", |m| {
        metric(m, "warden_agent_collector_up{collector=\"pod_resources\"}") == Some(0.0)
    });
    assert!(labelled(&m, 1, "train/llama-1/trainer"), "{m}");

    // The kubelet restarts on a new socket file: the agent connects again.
    drop(kubelet);
    write_pods(&pods_file, &pods(("train", "llama-2", "trainer")));
    let _kubelet = FakeKubelet::start(&python, &socket, &pods_file);
    let m = agent.wait_metrics("GPU 1 labelled after the kubelet restarted", |m| {
        labelled(m, 1, "train/llama-2/trainer")
            && metric(m, "warden_agent_collector_up{collector=\"pod_resources\"}") == Some(1.0)
    });
    assert!(labelled(&m, 2, "infer/vllm-0/engine"), "{m}");
}
