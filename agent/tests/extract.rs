//! Metric presets and watchdog parsing on real-format lines: the formats Megatron-LM,
//! DeepSpeed, the Hugging Face Trainer, Lightning, mmengine and PyTorch print (numbers
//! and hosts changed).

use std::sync::Arc;

use warden_agent::logs::{
    Backend, CustomPattern, Extractor, LogLine, PresetCatalog, SourceConfig, StepMetric,
    TailConfig, ThroughputUnit, Watchdog, WatchdogKind, config::ThroughputUnitName, parse_watchdog,
};
use warden_model::wire::{CollOp, LogStream, TrainingMetric};

fn catalog() -> &'static PresetCatalog {
    if let Some(e) = PresetCatalog::builtin_error() {
        panic!("rules/log-presets.yaml fails to load: {e}");
    }
    PresetCatalog::builtin()
}

fn line(text: &str) -> LogLine {
    line_from("/logs/train.log", None, text)
}

fn line_from(source: &str, rank: Option<u32>, text: &str) -> LogLine {
    LogLine {
        source: Arc::from(source),
        source_index: 0,
        job: Some(Arc::from("llama")),
        rank,
        local_rank: None,
        at_ns: 42,
        stream: LogStream::Stdout,
        text: text.to_string(),
        truncated: false,
        lines: 1,
    }
}

fn metric(x: &mut Extractor, text: &str) -> StepMetric {
    x.metric(&line(text))
        .unwrap_or_else(|| panic!("no metric in {text:?}"))
}

fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() <= 1e-9 * b.abs().max(1.0))
}

fn is_nan(a: Option<f64>) -> bool {
    a.is_some_and(f64::is_nan)
}

#[test]
fn megatron() {
    let mut x = Extractor::with_presets(catalog());
    let m = metric(
        &mut x,
        " iteration     6502/  159576 | consumed samples:       216960 | consumed tokens:    444334080 | elapsed time per iteration (ms): 31074.1 | learning rate: 5.997E-05 | global batch size:    80 | lm loss: 3.876781E+00 | loss scale: 4096.0 | grad norm: 3246.595 | num zeros: 0.0 | number of skipped iterations:   0 | number of nan iterations:   0 |",
    );
    assert_eq!(&*m.preset, "megatron");
    assert_eq!((m.step, m.step_is_ordinal), (6502, false));
    assert!(close(m.loss, 3.876781));
    assert!(close(m.grad_norm, 3246.595));
    assert!(close(m.lr, 5.997e-5));
    let t = m
        .throughput
        .expect("samples/s from batch size and iteration time");
    assert_eq!(t.unit, ThroughputUnit::SamplesPerS);
    assert!(close(Some(t.value), 80.0 * 1000.0 / 31074.1));
    assert_eq!(m.job.as_deref(), Some("llama"));
    assert_eq!(m.at_ns, 42);

    // Newer layout with a timestamp and a tokens-per-GPU column; srun --label prefix.
    let m = metric(
        &mut x,
        "[2026-01-16 07:32:24] iteration        5/     100 | consumed samples:        10240 | elapsed time per iteration (ms): 13100.0/13240.9 | throughput per GPU (TFLOP/s/GPU): 579.4/573.6 | tokens per GPU (tokens/s/GPU): 10005.5/9903.7 | learning rate: 4.134000E-07 | global batch size:  2048 | lm loss: 1.344240E+01 | loss scale: 1.0 | grad norm: 2.870 | number of skipped iterations:   0 | number of nan iterations:   0 |",
    );
    assert_eq!(m.step, 5);
    assert_eq!(
        m.throughput,
        Some(warden_agent::logs::Throughput {
            value: 10005.5,
            unit: ThroughputUnit::TokensPerS
        })
    );
    let m = metric(
        &mut x,
        "1:  iteration       25/73242187 | consumed samples:           50 | elapsed time per iteration (ms): 87.0 | learning rate: 1.638E-08 | global batch size:     2 | lm loss: 1.086954E+01 | loss scale: 4294967296.0 | grad norm: 0.000 | number of skipped iterations:   0 | number of nan iterations:   0 |",
    );
    assert_eq!(m.step, 25);
    assert!(close(m.grad_norm, 0.0));
}

#[test]
fn megatron_nan_is_preserved() {
    let mut x = Extractor::with_presets(catalog());
    // Megatron leaves a NaN loss out of its average and counts the iteration instead.
    let m = metric(
        &mut x,
        " iteration      120/  1000 | consumed samples:        61440 | elapsed time per iteration (ms): 1500.2 | learning rate: 1.000E-04 | global batch size:   512 | loss scale: 1.0 | grad norm: nan | number of skipped iterations:   1 | number of nan iterations:   1 |",
    );
    assert!(is_nan(m.loss), "{m:?}");
    assert!(is_nan(m.grad_norm), "{m:?}");
    assert!(m.has_non_finite());
    let m = metric(
        &mut x,
        " iteration      121/  1000 | lm loss: inf | grad norm: -inf | number of nan iterations:   0 |",
    );
    assert_eq!(m.loss, Some(f64::INFINITY));
    assert_eq!(m.grad_norm, Some(f64::NEG_INFINITY));
}

#[test]
fn deepspeed() {
    let mut x = Extractor::with_presets(catalog());
    let m = metric(
        &mut x,
        "[2023-11-07 01:55:23,711] [INFO] [logging.py:96:log_dist] [Rank 0] step=10, skipped=4, lr=[4.99804827338393e-05, 4.99804827338393e-05], mom=[(0.9, 0.95), (0.9, 0.95)]",
    );
    assert_eq!(&*m.preset, "deepspeed");
    assert_eq!((m.step, m.rank), (10, Some(0)));
    assert!(close(m.lr, 4.998_048_273_383_93e-5));
    assert_eq!(m.loss, None);

    let m = metric(
        &mut x,
        "[2023-07-24 12:25:17,425] [INFO] [timer.py:215:stop] epoch=0/micro_step=100/global_step=100, RunningAvgSamplesPerSec=5720.511220447356, CurrSamplesPerSec=5370.427656850192, MemAllocated=0.01GB, MaxMemAllocated=0.12GB",
    );
    assert_eq!(&*m.preset, "deepspeed-throughput");
    assert_eq!(m.step, 100);
    let t = m.throughput.expect("throughput");
    assert_eq!(t.unit, ThroughputUnit::SamplesPerS);
    assert!(close(Some(t.value), 5370.427656850192));
    // Older timer format.
    let m = metric(
        &mut x,
        "[2022-08-29 06:58:56,176] [INFO] [timer.py:198:stop] 0/20, RunningAvgSamplesPerSec=232.7340551694273, CurrSamplesPerSec=227.48090316379353, MemAllocated=0.36GB, MaxMemAllocated=15.06GB",
    );
    assert_eq!(m.step, 20);

    let m = metric(
        &mut x,
        "steps: 200 loss: 5.5508 lm loss: 5.5103 moe loss: 0.0405 iter time (s): 0.936 samples/sec: 136.706",
    );
    assert_eq!(&*m.preset, "deepspeed-pipeline");
    assert_eq!(m.step, 200);
    assert!(close(m.loss, 5.5508));
    assert!(close(m.throughput.map(|t| t.value), 136.706));
    let m = metric(
        &mut x,
        "steps: 201 loss: nan iter time (s): 0.936 samples/sec: 136.706",
    );
    assert!(is_nan(m.loss));
}

#[test]
fn hf_trainer_counts_its_log_lines() {
    let mut x = Extractor::with_presets(catalog());
    let a = metric(
        &mut x,
        "{'loss': 2.1, 'grad_norm': 0.9, 'learning_rate': 5e-05, 'epoch': 0.1}",
    );
    assert_eq!(&*a.preset, "hf-trainer");
    assert_eq!((a.step, a.step_is_ordinal), (1, true));
    assert!(close(a.loss, 2.1) && close(a.grad_norm, 0.9) && close(a.lr, 5e-5));
    // Behind a tqdm bar, as it lands in a file.
    let b = metric(
        &mut x,
        " 10%|█         | 100/1000 [01:40<15:00,  1.00s/it]{'loss': 1.95, 'grad_norm': 1.2, 'learning_rate': 4.9e-05, 'epoch': 0.2}",
    );
    assert_eq!(b.step, 2);
    let c = metric(
        &mut x,
        "{'loss': nan, 'grad_norm': nan, 'learning_rate': 4.8e-05, 'epoch': 0.3}",
    );
    assert_eq!(c.step, 3);
    assert!(is_nan(c.loss) && is_nan(c.grad_norm));
    // Another rank counts on its own.
    let other = x
        .metric(&line_from(
            "/logs/train.log",
            Some(1),
            "{'loss': 2.2, 'learning_rate': 5e-05, 'epoch': 0.1}",
        ))
        .expect("metric");
    assert_eq!(other.step, 1);
    // A dict with a step uses it.
    let d = metric(&mut x, "{'loss': 1.5, 'grad_norm': 0.5, 'step': 750}");
    assert_eq!((d.step, d.step_is_ordinal), (750, false));
    // Evaluation and summary dicts are not training steps.
    for not in [
        "{'eval_loss': 1.9, 'eval_runtime': 12.3, 'epoch': 1.0}",
        "{'train_runtime': 1234.5, 'train_samples_per_second': 5.6, 'train_loss': 1.23, 'epoch': 3.0}",
    ] {
        assert_eq!(x.metric(&line(not)), None, "{not}");
    }
}

#[test]
fn lightning_progress_bars() {
    let mut x = Extractor::with_presets(catalog());
    let m = metric(
        &mut x,
        "Epoch 0:  10%|█         | 100/1000 [00:10<01:30,  9.95it/s, loss=2.34, v_num=0]",
    );
    assert_eq!(&*m.preset, "lightning");
    assert_eq!(m.step, 100);
    assert!(close(m.loss, 2.34));
    let t = m.throughput.expect("it/s");
    assert_eq!(t.unit, ThroughputUnit::ItersPerS);
    assert!(close(Some(t.value), 9.95));
    // Lightning 2.x postfix order, seconds per iteration, NaN loss, epoch 2.
    let m = metric(
        &mut x,
        "Epoch 2:  50%|█████     | 50/100 [01:01<01:01,  1.25s/it, v_num=3, train_loss=nan]",
    );
    assert_eq!(m.step, 250);
    assert!(is_nan(m.loss));
    assert!(close(m.throughput.map(|t| t.value), 0.8));
    // Validation bars are not training steps.
    assert_eq!(
        x.metric(&line(
            "Validation DataLoader 0:  50%|█████     | 5/10 [00:01<00:01,  4.00it/s]"
        )),
        None
    );
}

#[test]
fn nemo_progress_bar_with_a_watchdog_line_glued_on() {
    // A progress bar that was redrawn with `\r` and never ended with a newline, then
    // the watchdog's message: both are read.
    let text = "Epoch 0:   4%|█▍                               | 21377/480000 [4:12:40<90:21:04,  1.41it/s, loss=2.81, v_num=7k2q, reduced_train_loss=2.810, global_step=2.14e+4, consumed_samples=1.71e+7][E ProcessGroupNCCL.cpp:458] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=64140, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 17893402 milliseconds before timing out.";
    let mut x = Extractor::with_presets(catalog());
    let got = x.extract(&line_from("/logs/nemo.log", Some(0), text));
    let m = got.metric.expect("metric");
    assert_eq!(m.step, 21377);
    assert!(close(m.loss, 2.81));
    let w = got.watchdog.expect("watchdog");
    assert_eq!(w.kind, WatchdogKind::CollectiveTimeout);
    assert_eq!(
        (w.seq, w.timeout_ms, w.ran_for_ms),
        (Some(64140), Some(1_800_000), Some(17_893_402))
    );
    assert_eq!(w.rank, Some(0), "from the line's attribution");
}

#[test]
fn mmengine() {
    let mut x = Extractor::with_presets(catalog());
    let m = metric(
        &mut x,
        "04/17 08:44:31 - mmengine - INFO - Epoch(train) [1][410/1212]  lr: 1.9544e-04  eta: 3:09:49  time: 3.4118  data_time: 0.0052  memory: 14388  loss: 2.2874  grad_norm: nan",
    );
    assert_eq!(&*m.preset, "mmengine");
    assert_eq!(m.step, 410);
    assert!(close(m.loss, 2.2874));
    assert!(is_nan(m.grad_norm));
    assert!(close(m.lr, 1.9544e-4));
    let m = metric(
        &mut x,
        "2024/01/19 06:48:12 - mmengine - INFO - Iter(train) [  100/80000]  lr: 1.0e-02  eta: 1 day  time: 0.5  loss: 1.25  decode.loss_ce: 1.0",
    );
    assert_eq!(m.step, 100);
    assert!(close(m.loss, 1.25));
}

#[test]
fn ordinary_lines_give_nothing() {
    let mut x = Extractor::with_presets(catalog());
    for text in [
        "Loading Dataset...",
        "epoch : 5, avg train loss : 6.1437",
        "Iteration: 90 evalution reward 147.95927004941876",
        "steps:   0%|          | 0/412 [00:00<?, ?it/s]",
        "  1%|▏         | 1187/93750 [08:12<10:37:29,  2.42it/s]Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 16384.0",
        "[2022-02-14 19:05:31,117] [INFO] [stage2.py:1628:step] [deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1, reducing to 1",
        "",
    ] {
        assert_eq!(x.extract(&line(text)).metric, None, "{text}");
    }
}

#[test]
fn tracebacks_are_not_read_for_metrics() {
    let mut x = Extractor::with_presets(catalog());
    let mut l = line(
        "Traceback (most recent call last):\n  File \"x.py\", line 1\n    print({'loss': 2.0})\nValueError: iteration 5/10 |",
    );
    l.lines = 4;
    assert_eq!(x.metric(&l), None);
}

fn cfg_with(source: SourceConfig) -> TailConfig {
    TailConfig {
        sources: vec![source],
        ..TailConfig::default()
    }
}

#[test]
fn sources_choose_presets_and_add_their_own_patterns() {
    let mut s = SourceConfig::new(["/logs/*.log"]);
    s.presets = Some(vec!["megatron".into()]);
    s.patterns.push(CustomPattern {
        name: "my-loop".into(),
        regex: r"^step (?P<step>\d+) \| loss (?P<loss>%NUM%) \| (?P<throughput>%NUM%) samples/s"
            .into(),
        needle: Some("step ".into()),
        throughput_unit: ThroughputUnitName::Samples,
    });
    let mut x = Extractor::new(&cfg_with(s), catalog()).expect("valid");
    assert!(
        x.metric(&line(" iteration 5/10 | lm loss: 1.0E+00 |"))
            .is_some()
    );
    assert_eq!(
        x.metric(&line("{'loss': 2.1, 'grad_norm': 0.9}")),
        None,
        "hf-trainer not chosen"
    );
    let m = metric(&mut x, "step 7 | loss NaN | 123.5 samples/s");
    assert_eq!(&*m.preset, "my-loop");
    assert_eq!(m.step, 7);
    assert!(is_nan(m.loss));
    assert_eq!(
        m.throughput.map(|t| (t.value, t.unit)),
        Some((123.5, ThroughputUnit::SamplesPerS))
    );

    // A source with no presets at all.
    let mut none = SourceConfig::new(["/logs/*.log"]);
    none.presets = Some(Vec::new());
    let mut x = Extractor::new(&cfg_with(none), catalog()).expect("valid");
    assert_eq!(
        x.metric(&line(" iteration 5/10 | lm loss: 1.0E+00 |")),
        None
    );
}

#[test]
fn bad_preset_names_and_patterns_are_all_reported() {
    let mut s = SourceConfig::new(["/logs/*.log"]);
    s.presets = Some(vec!["megatorn".into(), "deepspeed".into()]);
    s.patterns.push(CustomPattern {
        name: "bad".into(),
        regex: r"step (?P<stpe>\d+)".into(),
        needle: None,
        throughput_unit: ThroughputUnitName::Tokens,
    });
    let e = Extractor::new(&cfg_with(s), catalog()).expect_err("invalid");
    let msg = e.to_string();
    assert!(
        msg.contains("sources[0].presets[0]: unknown preset \"megatorn\""),
        "{msg}"
    );
    assert!(
        msg.contains("sources[0].patterns[0].regex: unknown group name `stpe`"),
        "{msg}"
    );
}

#[test]
fn check_config_reports_tailer_and_preset_problems_together() {
    let mut s = SourceConfig::new(["/logs/[x"]);
    s.presets = Some(vec!["nope".into()]);
    let mut cfg = cfg_with(s);
    cfg.max_open_files = 0;
    let msg = warden_agent::logs::check_config(&cfg, catalog())
        .expect_err("three problems")
        .to_string();
    for want in [
        "max_open_files",
        "sources[0].paths[0]",
        "sources[0].presets[0]",
    ] {
        assert!(msg.contains(want), "{want} missing from {msg}");
    }
    let ok = cfg_with(SourceConfig::new(["/logs/*.log"]));
    assert_eq!(warden_agent::logs::check_config(&ok, catalog()), Ok(()));
}

#[test]
fn wire_form_keeps_non_finite_values() {
    let mut x = Extractor::with_presets(catalog());
    let m = metric(
        &mut x,
        "{'loss': nan, 'grad_norm': inf, 'learning_rate': 5e-05}",
    );
    assert_eq!(m.to_wire(None), None, "no rank, no wire form");
    let w: TrainingMetric = m.to_wire(Some(3)).expect("rank given");
    assert_eq!((w.rank, w.step, w.at_ns), (3, 1, 42));
    assert!(is_nan(w.loss));
    assert_eq!(w.grad_norm, Some(f64::INFINITY));
    assert_eq!(w.tokens_per_s, None);
    let json = serde_json::to_string(&w).expect("serializes");
    assert!(json.contains("\"loss\":\"NaN\""), "{json}");
    assert!(json.contains("\"grad_norm\":\"inf\""), "{json}");
}

fn watchdog(text: &str) -> Watchdog {
    parse_watchdog(text).unwrap_or_else(|| panic!("no watchdog in {text:?}"))
}

#[test]
fn watchdog_collective_timeout_old_and_new() {
    // PyTorch ≤ 2.1: no rank prefix, no element counts.
    let w = watchdog(
        "[E ProcessGroupNCCL.cpp:737] [Rank 5] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=312774, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1801487 milliseconds before timing out.",
    );
    assert_eq!(
        w,
        Watchdog {
            pg_rank: Some(5),
            seq: Some(312_774),
            op: Some("ALLREDUCE".into()),
            timeout_ms: Some(1_800_000),
            ran_for_ms: Some(1_801_487),
            ..Watchdog::new(WatchdogKind::CollectiveTimeout, Backend::Nccl)
        }
    );
    assert_eq!(w.coll_op(), CollOp::AllReduce);
    // 2.2 and later.
    let w = watchdog(
        "[rank4]:[E1109 14:37:52.603317482 ProcessGroupNCCL.cpp:629] [Rank 4] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=6, OpType=BROADCAST, NumelIn=96, NumelOut=96, Timeout(ms)=1800000) ran for 1800017 milliseconds before timing out.",
    );
    assert_eq!((w.rank, w.pg_rank), (Some(4), Some(4)));
    assert_eq!(
        (w.seq, w.numel_in, w.numel_out),
        (Some(6), Some(96), Some(96))
    );
    assert_eq!(w.coll_op(), CollOp::Broadcast);
    let w = watchdog(
        "[rank1]:[E ProcessGroupNCCL.cpp:574] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=_ALLGATHER_BASE, NumelIn=1024, NumelOut=16384, Timeout(ms)=600000) ran for 600029 milliseconds before timing out.",
    );
    assert_eq!(w.coll_op(), CollOp::AllGather);
    // The exception text that terminate() prints, with the process group in front.
    let w = watchdog(
        "  what():  [PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog thread terminated with exception: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2415, OpType=ALLREDUCE, NumelIn=8192, NumelOut=8192, Timeout(ms)=1800000) ran for 1800058 milliseconds before timing out.",
    );
    assert_eq!(w.kind, WatchdogKind::CollectiveTimeout);
    assert_eq!(
        (w.pg_id, w.pg_guid.as_deref(), w.pg_name.as_deref()),
        (Some(0), Some("0"), Some("default_pg"))
    );
    assert_eq!(w.seq, Some(2415));
}

#[test]
fn watchdog_progress_counters_in_each_release_format() {
    // 2.3 – 2.5.
    let w = watchdog(
        "[rank1]:[E ProcessGroupNCCL.cpp:1540] [PG 1 Rank 1] Timeout at NCCL work: 7, last enqueued NCCL work: 8, last completed NCCL work: 6.",
    );
    assert_eq!(w.kind, WatchdogKind::WorkTimeout);
    assert_eq!((w.pg_id, w.pg_rank, w.rank), (Some(1), Some(1), Some(1)));
    assert_eq!(
        (w.seq, w.last_enqueued, w.last_completed),
        (Some(7), Some(8), Some(6))
    );
    let w = watchdog(
        "[rank1]:[E1003 18:37:01.833575187 ProcessGroupNCCL.cpp:1664] [PG 0 (default_pg) Rank 1] Exception (either an error or timeout) detected by watchdog at work: 6463, last enqueued NCCL work: 6463, last completed NCCL work: 6462.",
    );
    assert_eq!(w.kind, WatchdogKind::WatchdogException);
    assert_eq!(w.pg_name.as_deref(), Some("default_pg"));
    assert_eq!(
        (w.seq, w.last_enqueued, w.last_completed),
        (Some(6463), Some(6463), Some(6462))
    );
    // 2.6 and later.
    let w = watchdog(
        "[rank1]:[E0307 03:51:26.517304862 ProcessGroupNCCL.cpp:2241] [PG ID 0 PG GUID 0(default_pg) Rank 1]  failure detected by watchdog at work sequence id: 1284 PG status: last enqueued work: 1315, last completed work: 1283",
    );
    assert_eq!(w.kind, WatchdogKind::FailureDetected);
    assert_eq!(
        (w.seq, w.last_enqueued, w.last_completed),
        (Some(1284), Some(1315), Some(1283))
    );
    assert_eq!((w.pg_id, w.pg_rank), (Some(0), Some(1)));
    let w = watchdog(
        "[rank1]:[E0307 03:51:26.761908345 ProcessGroupNCCL.cpp:1858] [PG ID 0 PG GUID 0(default_pg) Rank 1] Received a dump signal due to a collective timeout from this local rank and we will try our best to dump the debug info. Last enqueued NCCL work: 1315, last completed NCCL work: 1283.This is most likely caused by incorrect usages of collectives, e.g., wrong sizes used across ranks.",
    );
    assert_eq!(w.kind, WatchdogKind::DumpSignal);
    assert_eq!(
        (w.last_enqueued, w.last_completed, w.signalled_by),
        (Some(1315), Some(1283), None)
    );
    let w = watchdog(
        "[rank2]:[E430 12:00:00.000000000 ProcessGroupNCCL.cpp:1895] [PG ID 0 PG GUID 0(default_pg) Rank 2] Received a dump signal due to a collective timeout from rank 10 and we will try our best to dump the debug info. Last enqueued NCCL work: 166, last completed NCCL work: 166.",
    );
    assert_eq!((w.signalled_by, w.rank), (Some(10), Some(2)));
    let w = watchdog(
        "[rank25]:[F ProcessGroupNCCL.cpp:1169] [PG 0 Rank 25] [PG 0 Rank 25] ProcessGroupNCCL's watchdog got stuck for 600 seconds without making progress in monitoring enqueued collectives.",
    );
    assert_eq!(w.kind, WatchdogKind::WatchdogStuck);
    assert_eq!((w.timeout_ms, w.rank), (Some(600_000), Some(25)));
}

#[test]
fn gloo_timeout_inside_a_traceback() {
    // The first line that mentions a watchdog is not a report; the exception line is.
    let text = "[rank3]: Traceback (most recent call last):\n[rank3]:   File \"/app/watchdog.py\", line 3, in run\n[rank3]:   File \"/usr/local/lib/python3.12/dist-packages/torch/distributed/distributed_c10d.py\", line 5237, in barrier\n[rank3]:     work.wait()\n[rank3]: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 1800000ms for recv operation to complete";
    let w = watchdog(text);
    assert_eq!(w.kind, WatchdogKind::GlooTimeout);
    assert_eq!(w.backend, Backend::Gloo);
    assert_eq!((w.timeout_ms, w.rank), (Some(1_800_000), Some(3)));
    assert_eq!(w.coll_op(), CollOp::Recv);
}

#[test]
fn lines_that_only_mention_nccl_are_not_watchdog_reports() {
    for text in [
        "[rank7]:[E ProcessGroupNCCL.cpp:577] [Rank 7] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
        "[rank1]:[E0307 03:51:26.517442150 ProcessGroupNCCL.cpp:2573] [PG ID 0 PG GUID 0(default_pg) Rank 1] First PG on this rank to signal dumping.",
        "gpu-node-04:18833:19540 [2] NCCL INFO proxy.cc:698 -> 6",
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1691, unhandled cuda error",
        "the watchdog is a dog that watches",
    ] {
        assert_eq!(parse_watchdog(text), None, "{text}");
    }
}
