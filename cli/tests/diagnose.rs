//! `warden diagnose` end to end: answers in text and JSON, from files and stdin, the
//! corpus evaluation, and every kind of bad input refused with a message and its exit
//! code, never a panic.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn warden(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_warden"))
        .args(args)
        .output()
        .expect("runs warden")
}

fn warden_stdin(args: &[&str], input: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_warden"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawns warden");
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(input)
        .expect("writes stdin");
    child.wait_with_output().expect("warden finishes")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("warden-diagnose-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

fn write(name: &str, bytes: &[u8]) -> String {
    let path = scratch(name);
    std::fs::write(&path, bytes).expect("write input");
    path.to_str().expect("utf8 path").to_owned()
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

fn assert_no_panic(out: &Output) {
    assert!(
        !text(&out.stderr).contains("panicked"),
        "{}",
        text(&out.stderr)
    );
}

const XID_LOG: &str = "\
Mar 14 04:52:20 gpu-node-15 kernel: [  290.1] NVRM: loading NVIDIA UNIX x86_64 Kernel Module
Mar 14 04:52:23 gpu-node-15 kernel: [  312.5] NVRM: Xid (PCI:0000:41:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer
[rank0]:[E ProcessGroupNCCL.cpp:737] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600100 milliseconds before timing out.
";

const OOM_LINE: &str = "[rank5]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 5 has a total capacity of 79.10 GiB of which 1.00 GiB is free.\n";

#[test]
fn a_log_file_is_diagnosed_in_text_and_json() {
    let log = write("xid.log", XID_LOG.as_bytes());
    let out = warden(&["diagnose", &log]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for needle in [
        "Category:    ecc_memory_error",
        "Fault locus: hardware",
        "host gpu-node-15, GPU 0000:41:00.0",
        "ecc.xid_uncorrectable",
        "line 1",
    ] {
        assert!(stdout.contains(needle), "missing {needle:?}:\n{stdout}");
    }

    let out = warden(&["diagnose", "--json", &log]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON answer");
    assert_eq!(json["category"], "ecc_memory_error");
    assert_eq!(json["fault_locus"], "hardware");
    assert_eq!(json["culprit"]["nodes"][0], "gpu-node-15");
    assert_eq!(json["culprit"]["gpus"][0], "0000:41:00.0");
    assert_eq!(json["rule_ids"][0], "ecc.xid_uncorrectable");
    assert_eq!(json["evidence"][0]["id"], 1);
    assert!(
        json["confidence"].as_f64().is_some_and(|c| c > 0.5),
        "{json}"
    );
    assert!(
        json["explanation"]
            .as_str()
            .is_some_and(|e| e.contains("line 1"))
    );
}

#[test]
fn stdin_is_read_when_no_file_is_given() {
    let out = warden_stdin(&["diagnose", "--json"], OOM_LINE.as_bytes());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON answer");
    assert_eq!(json["category"], "gpu_oom");
    assert_eq!(json["culprit"]["ranks"][0], 5);
}

#[test]
fn binary_input_is_refused_with_exit_65() {
    let bin = write(
        "core.bin",
        b"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00CUDA out of memory",
    );
    let out = warden(&["diagnose", &bin]);
    assert_no_panic(&out);
    assert_eq!(out.status.code(), Some(65), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("binary"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_ten_megabyte_line_is_cut_and_the_rest_still_diagnosed() {
    let mut input = vec![b'a'; 10 * 1024 * 1024];
    input.push(b'\n');
    input.extend_from_slice(OOM_LINE.as_bytes());
    let out = warden_stdin(&["diagnose", "--json"], &input);
    assert_no_panic(&out);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("1 line(s) longer than 64 KiB were cut"),
        "{}",
        text(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON answer");
    assert_eq!(json["category"], "gpu_oom");
    assert_eq!(json["evidence"][0]["id"], 1);
}

#[test]
fn invalid_utf8_is_replaced_with_a_warning() {
    let mut input = b"garbage \xff\xfe\xfd here\n".to_vec();
    input.extend_from_slice(OOM_LINE.as_bytes());
    let log = write("latin1.log", &input);
    let out = warden(&["diagnose", &log]);
    assert_no_panic(&out);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("invalid UTF-8"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        text(&out.stdout).contains("gpu_oom"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn an_empty_file_is_refused_with_exit_65() {
    let empty = write("empty.log", b"");
    let out = warden(&["diagnose", &empty]);
    assert_no_panic(&out);
    assert_eq!(out.status.code(), Some(65), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("empty"), "{}", text(&out.stderr));
}

#[test]
fn a_missing_file_is_refused_with_exit_66() {
    let out = warden(&["diagnose", "/nonexistent/warden/train.log"]);
    assert_no_panic(&out);
    assert_eq!(out.status.code(), Some(66), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("cannot open /nonexistent/warden/train.log"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_rules_dir_with_a_broken_regex_exits_64_naming_file_and_rule() {
    let dir = scratch("rules-broken");
    std::fs::create_dir_all(&dir).expect("rules dir");
    std::fs::write(
        dir.join("site.yaml"),
        r#"
- id: site.broken
  description: a rule whose regex does not compile
  version: 1
  category: storage_io_error
  fault_locus: infrastructure
  severity: error
  role: cause
  patterns: ['disk (full']
  tests: [{line: "disk (full"}]
"#,
    )
    .expect("write rule");
    let log = write("for-rules.log", OOM_LINE.as_bytes());
    let out = warden(&["diagnose", "--rules", dir.to_str().expect("utf8"), &log]);
    assert_no_panic(&out);
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("site.yaml: rule site.broken: pattern 1: bad regex"),
        "{stderr}"
    );
}

#[test]
fn a_rules_dir_overrides_a_shipped_file() {
    let dir = scratch("rules-override");
    std::fs::create_dir_all(&dir).expect("rules dir");
    // Replacing memory.yaml with an empty file removes the GPU OOM rule.
    std::fs::write(dir.join("memory.yaml"), "# no memory rules here\n").expect("write");
    let log = write("override.log", OOM_LINE.as_bytes());
    let out = warden(&[
        "diagnose",
        "--json",
        "--rules",
        dir.to_str().expect("utf8"),
        &log,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON answer");
    assert_ne!(json["category"], "gpu_oom", "{json}");
}

#[test]
fn eval_reports_accuracy_and_a_confusion_matrix() {
    let corpus = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../diagnosis/tests/data/failure-logs-dev.jsonl"
    );
    let out = warden(&["diagnose", "--eval", corpus]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("| category accuracy |"), "{stdout}");
    assert!(stdout.contains("| label \\ answer |"), "{stdout}");

    let out = warden(&["diagnose", "--eval", corpus, "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    assert_eq!(json["evaluation"]["cases"], 37);
    assert!(
        json["category_accuracy"].as_f64().is_some_and(|a| a >= 0.9),
        "{json}"
    );
    assert!(json["confusion"].as_array().is_some_and(|c| !c.is_empty()));
}

#[test]
fn eval_of_a_bad_corpus_exits_65() {
    let bad = write(
        "bad.jsonl",
        b"{\"id\": \"x\", \"category\": \"gpu_on_fire\"}\n",
    );
    let out = warden(&["diagnose", "--eval", &bad]);
    assert_no_panic(&out);
    assert_eq!(out.status.code(), Some(65), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("line 1"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn eval_with_log_files_is_a_usage_error_64() {
    let out = warden(&["diagnose", "--eval", "corpus.jsonl", "train.log"]);
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
}
