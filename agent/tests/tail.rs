//! The log tailer against real files in a temporary directory: framing, CRI, rotation,
//! truncation, tracebacks, garbage, discovery, idle flushes and attribution. Time is
//! injected: every poll is given its `now`, nothing sleeps.

use std::{
    fs::{self, File, OpenOptions},
    io::Write,
    path::Path,
};

use warden_agent::logs::{
    Format, LogLine, SourceConfig, StartAt, TailConfig, Tailer, attribution::split_pod_name,
};
use warden_model::wire::LogStream;

const MS: i64 = 1_000_000;
const SEC: i64 = 1_000_000_000;
/// Some agent-clock start time.
const T0: i64 = 1_714_564_800 * SEC;

fn config(globs: &[&Path]) -> TailConfig {
    TailConfig {
        sources: vec![SourceConfig::new(
            globs.iter().map(|g| g.to_string_lossy().into_owned()),
        )],
        start_at: StartAt::Beginning,
        rescan_interval_ms: 1_000,
        ..TailConfig::default()
    }
}

fn tailer(cfg: TailConfig) -> Tailer {
    Tailer::new(cfg).expect("valid config")
}

fn poll(t: &mut Tailer, now: i64) -> Vec<LogLine> {
    let mut out = Vec::new();
    t.poll(now, &mut out);
    out
}

fn texts(v: &[LogLine]) -> Vec<&str> {
    v.iter().map(|l| l.text.as_str()).collect()
}

fn append(path: &Path, bytes: &[u8]) {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open for append");
    f.write_all(bytes).expect("write");
}

#[test]
fn plain_lines_in_order_with_read_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("train.log");
    append(&log, b"one\ntwo\r\nthree");
    let mut t = tailer(config(&[&dir.path().join("*.log")]));
    let got = poll(&mut t, T0);
    assert_eq!(texts(&got), ["one", "two"]);
    assert!(
        got.iter()
            .all(|l| l.at_ns == T0 && l.stream == LogStream::Stdout)
    );
    assert_eq!(&*got[0].source, log.to_string_lossy());
    append(&log, b" and more\n");
    let got = poll(&mut t, T0 + 250 * MS);
    assert_eq!(texts(&got), ["three and more"]);
    let c = t.counters();
    assert_eq!(c.lines_read, 3);
    assert_eq!(c.records_emitted, 3);
    assert_eq!(c.bytes_read, 24);
    assert_eq!(c.files_open, 1);
}

#[test]
fn cri_partial_records_are_joined_and_attributed_to_the_pod() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pod_dir = dir
        .path()
        .join("train_llama-node-0-3-xk2pq_0f1e2d3c-4b5a-6978-8899-aabbccddeeff")
        .join("trainer");
    fs::create_dir_all(&pod_dir).expect("mkdir");
    let log = pod_dir.join("0.log");
    append(
        &log,
        b"2024-05-01T12:00:00.000000001Z stdout P iteration      100/  1000 | lm loss: \n\
          2024-05-01T12:00:00.000000002Z stderr F [rank3]: warning on stderr\n\
          2024-05-01T12:00:00.000000003Z stdout P 2.345E+00 |\n",
    );
    let mut cfg = config(&[&dir.path().join("*/*/*.log")]);
    cfg.sources[0].ranks_per_pod = Some(8);
    let mut t = tailer(cfg);
    let got = poll(&mut t, T0);
    assert_eq!(texts(&got), ["[rank3]: warning on stderr"]);
    assert_eq!(got[0].stream, LogStream::Stderr);
    assert_eq!(got[0].at_ns, 1_714_564_800_000_000_002);
    assert_eq!(got[0].rank, Some(3));
    append(
        &log,
        b"2024-05-01T12:00:00.000000004Z stdout F  grad norm: 1.234 |\n\
          2024-05-01T12:00:01Z stdout F [default5]:next\n",
    );
    let got = poll(&mut t, T0 + 250 * MS);
    assert_eq!(
        texts(&got),
        [
            "iteration      100/  1000 | lm loss: 2.345E+00 | grad norm: 1.234 |",
            "[default5]:next"
        ]
    );
    // The joined line carries the time of its first piece.
    assert_eq!(got[0].at_ns, 1_714_564_800_000_000_001);
    assert_eq!(got[0].stream, LogStream::Stdout);
    assert_eq!(got[0].job.as_deref(), Some("llama"));
    // Pod index 3 with 8 ranks per pod: local rank 5 is global rank 29.
    assert_eq!((got[1].rank, got[1].local_rank), (Some(29), Some(5)));
    assert_eq!(got[1].at_ns, 1_714_564_801 * SEC);
    assert_eq!(t.counters().cri_malformed, 0);
}

#[test]
fn cri_joined_line_longer_than_the_limit_is_cut_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("c.log");
    let piece = "x".repeat(300);
    let mut data = String::new();
    for _ in 0..5 {
        data.push_str(&format!("2024-05-01T12:00:00Z stdout P {piece}\n"));
    }
    data.push_str("2024-05-01T12:00:00Z stdout F end\n2024-05-01T12:00:01Z stdout F after\n");
    append(&log, data.as_bytes());
    let mut cfg = config(&[&log]);
    cfg.sources[0].format = Format::Cri;
    cfg.max_line_bytes = 1000;
    let mut t = tailer(cfg);
    let got = poll(&mut t, T0);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].text.len(), 1000);
    assert!(got[0].truncated);
    assert_eq!(got[1].text, "after");
    assert!(!got[1].truncated);
}

#[test]
fn rotation_by_rename_loses_nothing_and_keeps_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("train.log");
    let rotated = dir.path().join("train.log.1");
    append(&log, b"a\nb\n");
    // The glob also matches the rotated name: it must not be read twice.
    let mut t = tailer(config(&[&dir.path().join("train.log*")]));
    assert_eq!(texts(&poll(&mut t, T0)), ["a", "b"]);

    // Written to the old file just before the rename, then the rename, then the new file.
    let mut writer = OpenOptions::new()
        .append(true)
        .open(&log)
        .expect("writer keeps the old file open");
    writer.write_all(b"c\nd\n").expect("write");
    fs::rename(&log, &rotated).expect("rename");
    append(&log, b"e\nf\n");
    let got = poll(&mut t, T0 + 250 * MS);
    assert_eq!(texts(&got), ["c", "d", "e", "f"]);
    assert_eq!(t.counters().rotations, 1);

    // The writer had not reopened yet: a late line in the rotated file is still read
    // (once a rescan finds it), and nothing is read twice.
    writer.write_all(b"late\n").expect("write");
    append(&log, b"g\n");
    let mut rest = Vec::new();
    for i in 2..12 {
        rest.extend(poll(&mut t, T0 + i * 250 * MS));
    }
    let mut rest = texts(&rest);
    rest.sort_unstable();
    assert_eq!(rest, ["g", "late"]);
}

#[test]
fn copytruncate_restarts_from_the_beginning() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("train.log");
    append(&log, b"first line\nsecond line\n");
    let mut t = tailer(config(&[&log]));
    assert_eq!(poll(&mut t, T0).len(), 2);
    // logrotate copytruncate: copy elsewhere, truncate in place; the writer appends.
    fs::copy(&log, dir.path().join("train.log.1")).expect("copy");
    File::create(&log).expect("truncate");
    append(&log, b"new\n");
    let got = poll(&mut t, T0 + 250 * MS);
    assert_eq!(texts(&got), ["new"]);
    let c = t.counters();
    assert_eq!((c.rotations, c.truncations), (1, 1));
}

#[test]
fn megabyte_line_is_cut_marked_and_never_held_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("big.log");
    File::create(&log).expect("create");
    let mut cfg = config(&[&log]);
    cfg.max_line_bytes = 16 * 1024;
    let mut t = tailer(cfg);
    assert!(poll(&mut t, T0).is_empty());
    // A 1 MB line arriving over several polls, then two normal lines.
    let chunk = vec![b'a'; 256 * 1024];
    let mut got = Vec::new();
    for i in 0..4 {
        append(&log, &chunk);
        got.extend(poll(&mut t, T0 + (i + 1) * 100 * MS));
        assert!(
            t.buffered_bytes() <= 16 * 1024,
            "holds {} bytes",
            t.buffered_bytes()
        );
    }
    append(&log, b"aaaa\nnext\nlast\n");
    got.extend(poll(&mut t, T0 + SEC));
    assert_eq!(got.len(), 3);
    assert_eq!(got[0].text.len(), 16 * 1024);
    assert!(got[0].truncated);
    assert_eq!(texts(&got[1..]), ["next", "last"]);
    assert!(!got[1].truncated);
    assert_eq!(t.counters().lines_truncated, 1);
    assert_eq!(t.buffered_bytes(), 0);
}

#[test]
fn tracebacks_are_one_record_plain_prefixed_and_chained() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("rank_2.log");
    let chained = "Traceback (most recent call last):\n  File \"/opt/conda/lib/python3.9/site-packages/torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py\", line 158, in _create_tcp_store\n    store = TCPStore(\nRuntimeError: connect() timed out. Original timeout was 120000 ms.\n\nThe above exception was the direct cause of the following exception:\n\nTraceback (most recent call last):\n  File \"/opt/conda/bin/torchrun\", line 8, in <module>\n    sys.exit(main())\ntorch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store has failed. See inner exception for details.";
    let prefixed = "[rank7]: Traceback (most recent call last):\n[rank7]:   File \"/mnt/shared/LLaMA-Factory/src/llamafactory/launcher.py\", line 23, in <module>\n[rank7]:     run_exp()\n[rank7]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 88.00 MiB.";
    let text = format!(
        "epoch : 5, avg val loss : 6.1402\n{chained}\nwandb: Waiting for W&B process to finish\n{prefixed}\n[rank7]: after\n"
    );
    append(&log, text.as_bytes());
    let mut t = tailer(config(&[&log]));
    let got = poll(&mut t, T0);
    assert_eq!(
        texts(&got),
        [
            "epoch : 5, avg val loss : 6.1402",
            chained,
            "wandb: Waiting for W&B process to finish",
            prefixed,
            "[rank7]: after",
        ]
    );
    assert_eq!(got[1].lines, 11);
    assert_eq!(got[1].rank, Some(2), "rank from the path");
    assert_eq!(got[3].rank, Some(7), "a rank prefix beats the path");
    assert_eq!(got[3].lines, 4);
}

#[test]
fn traceback_at_the_end_of_a_dying_process_is_flushed_after_idle() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("train.log");
    append(
        &log,
        b"Traceback (most recent call last):\n  File \"train.py\", line 263, in <module>\n    train()\nRuntimeError: DataLoader worker (pid 31842) is killed by signal: Bus error.\n",
    );
    let mut t = tailer(config(&[&log]));
    // The traceback might go on (a chained exception): held for now.
    assert!(poll(&mut t, T0).is_empty());
    assert!(poll(&mut t, T0 + SEC).is_empty());
    let got = poll(&mut t, T0 + 2 * SEC);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].lines, 4);
    assert!(got[0].text.ends_with("Bus error."));
}

#[test]
fn binary_garbage_and_invalid_utf8_never_break_anything() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("garbage.log");
    // Deterministic pseudo-random bytes (xorshift), NUL runs, invalid UTF-8.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut junk = Vec::with_capacity(300_000);
    for _ in 0..300_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        junk.push((x >> 24) as u8);
    }
    junk.extend_from_slice(&[0; 50_000]);
    junk.extend_from_slice(b"\nvalid \xff\xfe text \xc3\x28 end\n\0\0\0ok\n");
    append(&log, &junk);
    let mut cfg = config(&[&log]);
    cfg.max_line_bytes = 1024;
    let mut t = tailer(cfg);
    let got = poll(&mut t, T0);
    assert!(!got.is_empty());
    for l in &got {
        // U+FFFD is 3 bytes: a cut line of 1024 bytes can grow, but stays bounded.
        assert!(l.text.len() <= 3 * 1024, "line of {} bytes", l.text.len());
        assert!(!l.text.contains('\0'));
    }
    let n = got.len();
    assert_eq!(got[n - 2].text, "valid \u{fffd}\u{fffd} text \u{fffd}( end");
    assert_eq!(got[n - 1].text, "ok");
    assert!(t.buffered_bytes() <= 1024);
}

#[test]
fn progress_bar_redraws_are_separate_lines() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("lightning.log");
    append(
        &log,
        "\rEpoch 0:   1%|          | 1/100 [00:01<01:39,  1.00it/s]\rEpoch 0:   2%|▏         | 2/100 [00:02<01:38,  1.00it/s, loss=2.34]\r\nnext line\n".as_bytes(),
    );
    let mut t = tailer(config(&[&log]));
    let got = poll(&mut t, T0);
    assert_eq!(
        texts(&got),
        [
            "Epoch 0:   1%|          | 1/100 [00:01<01:39,  1.00it/s]",
            "Epoch 0:   2%|▏         | 2/100 [00:02<01:38,  1.00it/s, loss=2.34]",
            "next line"
        ]
    );
}

#[test]
fn globs_pick_up_new_files_from_their_beginning() {
    let dir = tempfile::tempdir().expect("tempdir");
    let old = dir.path().join("rank_0.log");
    append(&old, b"history before the agent started\n");
    let mut cfg = config(&[&dir.path().join("rank_*.log")]);
    cfg.start_at = StartAt::End;
    let mut t = tailer(cfg);
    assert!(poll(&mut t, T0).is_empty(), "existing content is skipped");
    append(&old, b"new in old\n");
    let fresh = dir.path().join("rank_1.log");
    append(&fresh, b"first line of a new file\n");
    let got = poll(&mut t, T0 + 250 * MS);
    assert_eq!(texts(&got), ["new in old"], "not rescanned yet");
    let got = poll(&mut t, T0 + 1_250 * MS);
    assert_eq!(texts(&got), ["first line of a new file"]);
    assert_eq!(got[0].rank, Some(1));
    assert_eq!(t.open_files().len(), 2);
}

#[test]
fn start_at_end_skips_the_line_it_lands_in() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("train.log");
    append(&log, b"old line\nhalf of a li");
    let mut cfg = config(&[&log]);
    cfg.start_at = StartAt::End;
    let mut t = tailer(cfg);
    assert!(poll(&mut t, T0).is_empty());
    append(&log, b"ne\nwhole line\n");
    assert_eq!(texts(&poll(&mut t, T0 + 250 * MS)), ["whole line"]);
}

#[test]
fn partial_last_line_is_flushed_after_idle() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("train.log");
    append(
        &log,
        b"iteration 10/100 | lm loss: 2.0 |\nlast words before the hang",
    );
    let mut t = tailer(config(&[&log]));
    assert_eq!(poll(&mut t, T0).len(), 1);
    assert!(poll(&mut t, T0 + SEC).is_empty());
    assert!(poll(&mut t, T0 + 1_999 * MS).is_empty());
    let got = poll(&mut t, T0 + 2 * SEC);
    assert_eq!(texts(&got), ["last words before the hang"]);
    assert!(!got[0].truncated);
    assert_eq!(t.counters().partial_flushes, 1);
    assert!(poll(&mut t, T0 + 3 * SEC).is_empty(), "flushed once");
    append(&log, b" (resumed)\n");
    assert_eq!(texts(&poll(&mut t, T0 + 4 * SEC)), [" (resumed)"]);
}

#[test]
fn deleted_file_is_read_to_its_end_then_closed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("train.log");
    append(&log, b"a\n");
    let mut t = tailer(config(&[&log]));
    assert_eq!(poll(&mut t, T0).len(), 1);
    append(&log, b"b\nc\n");
    fs::remove_file(&log).expect("delete");
    assert_eq!(texts(&poll(&mut t, T0 + 250 * MS)), ["b", "c"]);
    assert!(t.open_files().is_empty());
    assert_eq!(t.counters().files_closed, 1);
    assert_eq!(t.counters().files_open, 0);
}

#[test]
fn more_files_than_allowed_open_are_all_read_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(&[&dir.path().join("*.log")]);
    cfg.max_open_files = 2;
    let mut t = tailer(cfg);
    for name in ["a", "b", "c"] {
        append(
            &dir.path().join(format!("{name}.log")),
            format!("{name}1\n").as_bytes(),
        );
    }
    let mut got = Vec::new();
    for i in 0..4 {
        got.extend(poll(&mut t, T0 + i * 1_100 * MS));
        assert!(t.open_files().len() <= 2);
    }
    for name in ["a", "b", "c"] {
        append(
            &dir.path().join(format!("{name}.log")),
            format!("{name}2\n").as_bytes(),
        );
    }
    for i in 4..12 {
        got.extend(poll(&mut t, T0 + i * 1_100 * MS));
        assert!(t.open_files().len() <= 2);
    }
    let mut all = texts(&got);
    all.sort_unstable();
    assert_eq!(all, ["a1", "a2", "b1", "b2", "c1", "c2"]);
    assert!(t.counters().files_evicted >= 1);
}

#[test]
fn each_poll_reads_a_bounded_amount_per_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("fast.log");
    let line = format!("{}\n", "y".repeat(99));
    append(&log, line.repeat(30_000).as_bytes()); // 3 MB
    let mut cfg = config(&[&log]);
    cfg.read_bytes_per_poll = 1024 * 1024;
    let mut t = tailer(cfg);
    let first = poll(&mut t, T0);
    assert_eq!(t.counters().bytes_read, 1024 * 1024);
    let mut n = first.len();
    for i in 1..4 {
        n += poll(&mut t, T0 + i * 250 * MS).len();
    }
    assert_eq!(n, 30_000);
    assert_eq!(t.counters().bytes_read, 3_000_000);
}

#[test]
fn attribution_from_config_paths_and_prefixes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let slurm = dir.path().join("slurm-4471829.out");
    append(
        &slurm,
        b"[Rank 0] step=10\n[rank5]:[E ProcessGroupNCCL.cpp:737] x\nplain\n",
    );
    let fixed = dir.path().join("fixed.log");
    append(&fixed, b"[rank5]: whatever\n");
    let mut cfg = config(&[&slurm]);
    let mut s = SourceConfig::new([fixed.to_string_lossy().into_owned()]);
    s.job = Some("static-job".into());
    s.rank = Some(11);
    cfg.sources.push(s);
    let mut t = tailer(cfg);
    let mut got = poll(&mut t, T0);
    got.sort_by_key(|l| l.source_index);
    let summary: Vec<(usize, Option<&str>, Option<u32>)> = got
        .iter()
        .map(|l| (l.source_index, l.job.as_deref(), l.rank))
        .collect();
    assert_eq!(
        summary,
        [
            (0, Some("4471829"), Some(0)),
            (0, Some("4471829"), Some(5)),
            (0, Some("4471829"), None),
            (1, Some("static-job"), Some(11)),
        ]
    );
    assert_eq!(split_pod_name("llama-master-0").job, "llama");
}

#[test]
fn bad_config_is_refused_with_every_problem() {
    let mut cfg = config(&[Path::new("/x/[")]);
    cfg.max_line_bytes = 1;
    let e = Tailer::new(cfg).expect_err("invalid");
    let msg = e.to_string();
    assert!(
        msg.contains("max_line_bytes") && msg.contains("sources[0].paths[0]"),
        "{msg}"
    );
}

#[test]
fn a_file_seen_through_a_symlink_and_directly_is_read_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let real = dir.path().join("pods");
    let links = dir.path().join("containers");
    fs::create_dir_all(&real).expect("mkdir");
    fs::create_dir_all(&links).expect("mkdir");
    let log = real.join("0.log");
    append(&log, b"once\n");
    std::os::unix::fs::symlink(&log, links.join("pod_ns_c.log")).expect("symlink");
    let mut t = tailer(config(&[&links.join("*.log"), &real.join("*.log")]));
    assert_eq!(texts(&poll(&mut t, T0)), ["once"]);
    assert_eq!(t.open_files().len(), 1);
}

#[test]
fn cri_progress_bar_pieces_become_lines_with_their_times() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("0.log");
    append(
        &log,
        "2024-05-01T12:00:00Z stderr P \rEpoch 0:   1%|          | 1/100 [00:01<01:39,  1.00it/s]\r\n\
         2024-05-01T12:00:01Z stderr P Epoch 0:   2%|▏         | 2/100 [00:02<01:38,  1.00it/s]\rEp\n\
         2024-05-01T12:00:02Z stderr F och 0:   3%|▎         | 3/100 [00:03<01:37,  1.00it/s]\n"
            .as_bytes(),
    );
    let mut cfg = config(&[&log]);
    cfg.sources[0].format = Format::Cri;
    let mut t = tailer(cfg);
    let got = poll(&mut t, T0);
    assert_eq!(
        texts(&got),
        [
            "Epoch 0:   1%|          | 1/100 [00:01<01:39,  1.00it/s]",
            "Epoch 0:   2%|▏         | 2/100 [00:02<01:38,  1.00it/s]",
            "Epoch 0:   3%|▎         | 3/100 [00:03<01:37,  1.00it/s]",
        ]
    );
    let secs: Vec<i64> = got.iter().map(|l| l.at_ns / SEC - 1_714_564_800).collect();
    assert_eq!(secs, [0, 1, 1]);
    assert!(got.iter().all(|l| l.stream == LogStream::Stderr));
}

#[test]
fn tailed_lines_become_wire_metrics_and_watchdog_reports() {
    use warden_agent::logs::{Extractor, PresetCatalog, WatchdogKind};
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("worker.log");
    append(
        &log,
        b"[rank3]: iteration      100/  1000 | consumed samples:        51200 | elapsed time per iteration (ms): 1000.0 | learning rate: 1.000E-04 | global batch size:   512 | lm loss: 2.345E+00 | loss scale: 1.0 | grad norm: nan | number of skipped iterations:   0 | number of nan iterations:   0 |\n\
          [rank3]:[E1109 14:37:52.603317482 ProcessGroupNCCL.cpp:629] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=6, OpType=BROADCAST, NumelIn=96, NumelOut=96, Timeout(ms)=1800000) ran for 1800017 milliseconds before timing out.\n",
    );
    let mut cfg = config(&[&log]);
    cfg.sources[0].job = Some("llama".into());
    let catalog = PresetCatalog::builtin();
    let mut x = Extractor::new(&cfg, catalog).expect("valid presets");
    let mut t = tailer(cfg);
    let lines = poll(&mut t, T0);
    assert_eq!(lines.len(), 2);
    let first = x.extract(&lines[0]);
    let m = first.metric.expect("megatron line");
    assert_eq!(
        (m.job.as_deref(), m.rank, m.step),
        (Some("llama"), Some(3), 100)
    );
    let wire = m.to_wire(None).expect("rank known");
    assert_eq!(wire.at_ns, T0);
    assert!(wire.grad_norm.is_some_and(f64::is_nan));
    let second = x.extract(&lines[1]);
    assert_eq!(second.metric, None);
    let w = second.watchdog.expect("watchdog line");
    assert_eq!(w.kind, WatchdogKind::CollectiveTimeout);
    assert_eq!((w.rank, w.seq), (Some(3), Some(6)));
    let record = lines[1].to_record();
    assert_eq!((record.rank, record.at_ns), (Some(3), T0));
}
