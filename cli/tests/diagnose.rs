//! `warden diagnose` end to end: answers in text and JSON, from files and stdin, the
//! corpus evaluation, refinement by a model (a local OpenAI-compatible server started by
//! the test), and every kind of bad input refused with a message and its exit code,
//! never a panic.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use serde_json::{Value, json};

/// The `warden` command, without model settings from the environment.
fn command() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_warden"));
    c.env_remove("WARDEN_LLM_URL")
        .env_remove("WARDEN_LLM_MODEL");
    c
}

fn warden(args: &[&str]) -> Output {
    command().args(args).output().expect("runs warden")
}

fn warden_stdin(args: &[&str], input: &[u8]) -> Output {
    let mut child = command()
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
    assert_eq!(json["evidence"][0]["id"], 2, "line numbers count from 1");
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
fn a_diagnosis_prints_in_every_output_format() {
    let log = write("xid-formats.log", XID_LOG.as_bytes());
    let json = warden(&["diagnose", "-o", "json", &log]);
    assert!(json.status.success(), "{}", text(&json.stderr));
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON answer");
    let yaml = warden(&["diagnose", &log, "--output", "yaml"]);
    assert!(yaml.status.success(), "{}", text(&yaml.stderr));
    let yaml: serde_json::Value =
        warden_model::yaml::from_str(&text(&yaml.stdout)).expect("YAML answer");
    assert_eq!(json, yaml, "the same answer as JSON and YAML");
    // `--json` is `-o json`, and the two together are a usage error.
    let old = warden(&["diagnose", "--json", &log]);
    let old: serde_json::Value = serde_json::from_slice(&old.stdout).expect("JSON answer");
    assert_eq!(old, json);
    let both = warden(&["diagnose", "--json", "-o", "yaml", &log]);
    assert_eq!(both.status.code(), Some(2), "{}", text(&both.stderr));
    // Text (`table`, and `wide` alike) gives the confidence as a percentage.
    let pct = format!(
        "Confidence:  {:.0}%",
        json["confidence"].as_f64().expect("a confidence") * 100.0
    );
    for format in ["table", "wide"] {
        let out = warden(&["diagnose", "-o", format, &log]);
        assert!(
            text(&out.stdout).contains(&pct),
            "{pct:?} in\n{}",
            text(&out.stdout)
        );
    }
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
fn binary_input_is_refused_with_exit_6() {
    let bin = write(
        "core.bin",
        b"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00CUDA out of memory",
    );
    let out = warden(&["diagnose", &bin]);
    assert_no_panic(&out);
    assert_eq!(out.status.code(), Some(6), "{}", text(&out.stderr));
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
    assert_eq!(json["evidence"][0]["id"], 2, "line numbers count from 1");
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
fn an_empty_file_is_refused_with_exit_6() {
    let empty = write("empty.log", b"");
    let out = warden(&["diagnose", &empty]);
    assert_no_panic(&out);
    assert_eq!(out.status.code(), Some(6), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("empty"), "{}", text(&out.stderr));
}

#[test]
fn a_missing_file_is_refused_with_exit_4() {
    let out = warden(&["diagnose", "/nonexistent/warden/train.log"]);
    assert_no_panic(&out);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("cannot open /nonexistent/warden/train.log"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_rules_dir_with_a_broken_regex_exits_2_naming_file_and_rule() {
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
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
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
fn eval_reads_a_directory_and_repeated_files_as_one_corpus() {
    let dev = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../diagnosis/tests/data/failure-logs-dev.jsonl"
    );
    let extra = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../diagnosis/tests/data/extra-cases.jsonl"
    );
    let out = warden(&["diagnose", "--eval", dev, "--eval", extra, "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    assert_eq!(json["evaluation"]["cases"], 37 + 22);

    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(dev, dir.path().join("a.jsonl")).expect("copy");
    std::fs::copy(extra, dir.path().join("b.jsonl")).expect("copy");
    std::fs::write(dir.path().join("notes.txt"), "not a corpus").expect("write");
    let path = dir.path().to_str().expect("utf8");
    let out = warden(&["diagnose", "--eval", path, "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    assert_eq!(
        json["evaluation"]["cases"],
        37 + 22,
        "only *.jsonl files count"
    );

    // The same file twice repeats every id: refused, nothing scored.
    let out = warden(&["diagnose", "--eval", dev, "--eval", dev]);
    assert_eq!(out.status.code(), Some(6), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("appears twice"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn eval_of_a_bad_corpus_exits_6() {
    let bad = write(
        "bad.jsonl",
        b"{\"id\": \"x\", \"category\": \"gpu_on_fire\"}\n",
    );
    let out = warden(&["diagnose", "--eval", &bad]);
    assert_no_panic(&out);
    assert_eq!(out.status.code(), Some(6), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("line 1"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn eval_with_log_files_is_a_usage_error_2() {
    let out = warden(&["diagnose", "--eval", "corpus.jsonl", "train.log"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

/// How the test model server answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Behaviour {
    /// A valid answer: `gpu_hardware_xid` on hardware, citing the first evidence line
    /// sent and naming the node and GPU the rules named (in their redacted form).
    Answer,
    /// A chat completion whose content is prose, not the answer schema.
    Garbage,
}

#[derive(Debug)]
struct ServerState {
    behaviour: Behaviour,
    /// Request bodies and `Authorization` headers received.
    requests: Mutex<Vec<(Value, Option<String>)>>,
}

/// An OpenAI-compatible chat-completions server on 127.0.0.1, running while it lives.
struct ModelServer {
    url: String,
    state: Arc<ServerState>,
    _runtime: tokio::runtime::Runtime,
}

impl ModelServer {
    fn start(behaviour: Behaviour) -> ModelServer {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("test runtime");
        let state = Arc::new(ServerState {
            behaviour,
            requests: Mutex::new(Vec::new()),
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(completions))
            .with_state(state.clone());
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        runtime.spawn(async move { axum::serve(listener, app).await });
        ModelServer {
            url: format!("http://{addr}/v1"),
            state,
            _runtime: runtime,
        }
    }

    fn requests(&self) -> Vec<(Value, Option<String>)> {
        self.state.requests.lock().expect("lock").clone()
    }
}

async fn completions(
    State(state): State<Arc<ServerState>>,
    headers: HeaderMap,
    body: Bytes,
) -> axum::Json<Value> {
    let request: Value = serde_json::from_slice(&body).expect("request body is JSON");
    let auth = headers
        .get("authorization")
        .map(|v| v.to_str().expect("ASCII header").to_owned());
    state
        .requests
        .lock()
        .expect("lock")
        .push((request.clone(), auth));
    let content = match state.behaviour {
        Behaviour::Garbage => "I think the GPU is broken, probably.".to_owned(),
        Behaviour::Answer => {
            let user: Value = serde_json::from_str(
                request["messages"][1]["content"]
                    .as_str()
                    .expect("user message is text"),
            )
            .expect("user message is a JSON document");
            let first = user["evidence"][0]["id"].as_u64().expect("evidence sent");
            let hint = &user["rules_answer"]["culprit"];
            json!({
                "category": "gpu_hardware_xid",
                "fault_locus": "hardware",
                "culprit": {"ranks": [], "nodes": hint["nodes"], "gpus": hint["gpus"],
                            "text": "the GPU the kernel reported"},
                "confidence": 0.7,
                "evidence_ids": [first],
                "explanation": format!("The kernel reports the GPU failing [{first}]."),
                "recommended_action": "Drain the node and test the GPU."
            })
            .to_string()
        }
    };
    axum::Json(json!({
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "model": request["model"],
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 500, "completion_tokens": 80, "total_tokens": 580}
    }))
}

#[test]
fn a_model_refines_the_answer_and_sees_only_redacted_evidence() {
    let server = ModelServer::start(Behaviour::Answer);
    let log = write("llm-xid.log", XID_LOG.as_bytes());
    let key = write("llm-key", b"sk-test-key-123\n");
    let out = warden(&[
        "diagnose",
        "--json",
        "--llm-url",
        &server.url,
        "--llm-model",
        "test-model",
        "--llm-key-file",
        &key,
        &log,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: Value = serde_json::from_slice(&out.stdout).expect("JSON answer");
    assert_eq!(json["source"], "llm:test-model", "{json}");
    assert_eq!(json["category"], "gpu_hardware_xid", "{json}");
    // The pseudonym the model was given comes back as the real host.
    assert_eq!(json["culprit"]["nodes"], json!(["gpu-node-15"]), "{json}");
    assert_eq!(json["rule_ids"][0], "ecc.xid_uncorrectable", "{json}");

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let (body, auth) = &requests[0];
    assert_eq!(body["model"], "test-model");
    assert_eq!(body["messages"][0]["role"], "system");
    assert_eq!(body["messages"][1]["role"], "user");
    assert_eq!(auth.as_deref(), Some("Bearer sk-test-key-123"));
    let user: Value = serde_json::from_str(
        body["messages"][1]["content"]
            .as_str()
            .expect("user message"),
    )
    .expect("user JSON");
    assert_eq!(user["evidence"][0]["id"], 2, "{user}");
    assert!(
        user["evidence"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("Xid (PCI:0000:41:00): 48")),
        "{user}"
    );
    assert_eq!(user["rules_answer"]["category"], "ecc_memory_error");
    assert!(
        !body.to_string().contains("gpu-node-15"),
        "the host name left unredacted: {body}"
    );

    // Text form: the source, and the rules' answer beside the model's.
    let out = warden(&[
        "diagnose",
        "--llm-url",
        &server.url,
        "--llm-model",
        "test-model",
        &log,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for needle in [
        "Category:    gpu_hardware_xid",
        "Source:      llm:test-model",
        "Rules said:  ecc_memory_error (hardware)",
    ] {
        assert!(stdout.contains(needle), "missing {needle:?}:\n{stdout}");
    }
}

#[test]
fn the_model_settings_can_come_from_the_environment() {
    let server = ModelServer::start(Behaviour::Answer);
    let out = command()
        .args(["diagnose", "--json"])
        .arg(write("llm-env.log", XID_LOG.as_bytes()))
        .env("WARDEN_LLM_URL", &server.url)
        .env("WARDEN_LLM_MODEL", "env-model")
        .output()
        .expect("runs warden");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: Value = serde_json::from_slice(&out.stdout).expect("JSON answer");
    assert_eq!(json["source"], "llm:env-model", "{json}");
    assert_eq!(server.requests()[0].0["model"], "env-model");
}

#[test]
fn a_garbage_answer_falls_back_to_the_rules_with_exit_0() {
    let server = ModelServer::start(Behaviour::Garbage);
    let log = write("llm-garbage.log", XID_LOG.as_bytes());
    let out = warden(&[
        "diagnose",
        "--json",
        "--llm-url",
        &server.url,
        "--llm-model",
        "test-model",
        &log,
    ]);
    assert_no_panic(&out);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: Value = serde_json::from_slice(&out.stdout).expect("JSON answer");
    assert_eq!(json["source"], "rules", "{json}");
    assert_eq!(json["category"], "ecc_memory_error", "{json}");
    assert!(
        json["explanation"]
            .as_str()
            .is_some_and(|e| e.ends_with("(LLM not used: malformed)")),
        "{json}"
    );
    let stderr = text(&out.stderr);
    assert!(stderr.contains("LLM not used (malformed)"), "{stderr}");
    // Not retried: an unusable answer is not a transient failure.
    assert_eq!(server.requests().len(), 1);
}

#[test]
fn bad_model_settings_exit_2() {
    let log = write("llm-bad.log", XID_LOG.as_bytes());
    let key = write("llm-key-2", b"sk-x\n");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--llm-url", "ftp://127.0.0.1/v1", "--llm-model", "m"],
            "base_url",
        ),
        (
            vec!["--llm-url", "not a url", "--llm-model", "m"],
            "base_url",
        ),
        (
            vec!["--llm-url", "http://127.0.0.1:9/v1"],
            "needs --llm-model",
        ),
        (vec!["--llm-model", "m"], "need --llm-url"),
        (
            vec![
                "--llm-url",
                "http://127.0.0.1:9/v1",
                "--llm-model",
                "m",
                "--llm-timeout-secs",
                "0",
            ],
            "timeout_ms",
        ),
        (
            vec![
                "--llm-url",
                "http://127.0.0.1:9/v1",
                "--llm-model",
                "m",
                "--llm-key-env",
                "WARDEN_TEST_UNSET_KEY_VARIABLE",
            ],
            "WARDEN_TEST_UNSET_KEY_VARIABLE",
        ),
        (
            vec![
                "--llm-url",
                "http://127.0.0.1:9/v1",
                "--llm-model",
                "m",
                "--llm-key-env",
                "K",
                "--llm-key-file",
                &key,
            ],
            "cannot be used with",
        ),
    ];
    for (flags, says) in cases {
        let mut args = vec!["diagnose"];
        args.extend(flags.iter().copied());
        args.push(&log);
        let out = warden(&args);
        assert_no_panic(&out);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{flags:?}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains(says),
            "{flags:?}: {}",
            text(&out.stderr)
        );
        assert!(out.stdout.is_empty(), "{flags:?}: {}", text(&out.stdout));
    }
}

/// Two labelled cases: an XID 48 the rules call an ECC error (labelled an XID here, so
/// the rules miss it and the test model does not), and a GPU OOM.
fn two_case_corpus() -> String {
    let cases = [
        json!({"id": "t-xid", "category": "gpu_hardware_xid", "fault_locus": "hardware",
               "culprit": "host gpu-node-15", "excerpt": XID_LOG}),
        json!({"id": "t-oom", "category": "gpu_oom", "fault_locus": "user-code",
               "culprit": "rank 5", "excerpt": OOM_LINE}),
    ];
    let lines: Vec<String> = cases.iter().map(Value::to_string).collect();
    write("llm-corpus.jsonl", lines.join("\n").as_bytes())
}

#[test]
fn eval_with_a_model_prints_rules_and_model_side_by_side() {
    let corpus = two_case_corpus();
    let server = ModelServer::start(Behaviour::Answer);
    let args = [
        "diagnose",
        "--eval",
        &corpus,
        "--llm-url",
        &server.url,
        "--llm-model",
        "test-model",
    ];
    let out = warden(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for needle in [
        "Rules and llm:test-model, 2 cases",
        "| category accuracy | 0.500 (1/2) | 0.500 (1/2) |",
        "| fault locus accuracy | 1.000 (2/2) | 0.500 (1/2) |",
        "Model answers used: 2 of 2. Fallbacks to the rules' answer: none.",
        "| t-xid | gpu_hardware_xid / hardware | ecc_memory_error / hardware | gpu_hardware_xid / hardware | refined |",
        "| t-oom | gpu_oom / user-code | gpu_oom / user-code | gpu_hardware_xid / hardware | refined |",
    ] {
        assert!(stdout.contains(needle), "missing {needle:?}:\n{stdout}");
    }
    assert_eq!(server.requests().len(), 2);

    let garbage = ModelServer::start(Behaviour::Garbage);
    let mut json_args = args.to_vec();
    json_args[4] = &garbage.url;
    json_args.push("--json");
    let out = warden(&json_args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let s = &json["summary"];
    assert_eq!(s["cases"], 2, "{json}");
    assert_eq!(s["refined"], 0, "{json}");
    assert_eq!(s["fallbacks"]["malformed"], 2, "{json}");
    assert_eq!(
        s["rules_category_correct"], s["llm_category_correct"],
        "{json}"
    );
    assert_eq!(json["cases"][1]["outcome"], "malformed", "{json}");
    assert_eq!(json["cases"][1]["source"], "rules", "{json}");
}
