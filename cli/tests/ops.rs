//! The operator commands against the real `warden-controller` binary on a loopback
//! port, with a token file of four roles and a store in a temp dir: list, show, ack,
//! resolve, drain, nodes, undrain, remediation (status and an admin's breaker reset)
//! and whoami; exit codes 2 to 5; a server that is down; the token from a flag, a file,
//! the environment and config files, and never printed.
//!
//! The controller binary is the one of the same build (`cargo test --workspace` builds
//! it); when it is missing, the test builds it with `cargo build -p warden-controller`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;
use warden_controller::auth::{hash_token, new_token};
use warden_model::wire::{Batch, EventSeverity, Heartbeat, NodeEvent, NodeEventKind};
use warden_testkit::{PATIENCE, poll, scaled, wait_for, wait_until};

/// `warden-controller` next to the `warden` binary under test, built when missing.
fn controller_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let warden = Path::new(env!("CARGO_BIN_EXE_warden"));
        let bin = warden.with_file_name("warden-controller");
        if bin.exists() {
            return bin;
        }
        // target/<profile>/warden: build the controller into the same place.
        let profile_dir = warden.parent().expect("profile dir");
        let target_dir = profile_dir.parent().expect("target dir");
        let profile = profile_dir
            .file_name()
            .and_then(|p| p.to_str())
            .expect("profile name");
        let profile = if profile == "debug" { "dev" } else { profile };
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| env!("CARGO").to_owned());
        eprintln!("building warden-controller ({profile}) for the operator tests");
        let status = Command::new(cargo)
            .args([
                "build",
                "-p",
                "warden-controller",
                "--bin",
                "warden-controller",
            ])
            .args(["--profile", profile, "--target-dir"])
            .arg(target_dir)
            .status()
            .expect("cargo runs");
        assert!(status.success(), "cargo build -p warden-controller failed");
        assert!(
            bin.exists(),
            "{} is missing after the build: run `cargo build -p warden-controller`",
            bin.display()
        );
        bin
    })
    .clone()
}

use warden_testkit::ports::free_port;

/// The tokens of the token file, one per role.
struct Tokens {
    admin: String,
    operator: String,
    viewer: String,
    agent: String,
}

impl Tokens {
    fn new() -> Tokens {
        let t = || new_token().expect("a token");
        Tokens {
            admin: t(),
            operator: t(),
            viewer: t(),
            agent: t(),
        }
    }

    fn all(&self) -> [&str; 4] {
        [&self.admin, &self.operator, &self.viewer, &self.agent]
    }

    fn yaml(&self) -> String {
        let mut s = "tokens:\n".to_owned();
        for (name, role, token) in [
            ("root", "admin", &self.admin),
            ("alice", "operator", &self.operator),
            ("victor", "viewer", &self.viewer),
            ("agents", "agent", &self.agent),
        ] {
            s.push_str(&format!(
                "  - {{name: {name}, role: {role}, sha256: {}}}\n",
                hash_token(token)
            ));
        }
        s
    }
}

/// A running controller with its tokens, a scratch dir and every output the CLI gave.
struct Ctl {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
    tokens: Tokens,
    seen: Vec<String>,
}

impl Drop for Ctl {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// (status, body) of one request, over a plain socket.
fn http(port: u16, method: &str, path: &str, token: &str, ct: &str, body: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(scaled(PATIENCE))).expect("timeout");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: {ct}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .expect("write");
    s.write_all(body).expect("write body");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read");
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status");
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_owned())
}

impl Ctl {
    fn start() -> Ctl {
        let dir = tempfile::tempdir().expect("temp dir");
        let tokens = Tokens::new();
        let tokens_file = dir.path().join("tokens.yaml");
        std::fs::write(&tokens_file, tokens.yaml()).expect("write tokens");
        std::fs::create_dir_all(dir.path().join("data")).expect("data dir");
        std::fs::create_dir_all(dir.path().join("home")).expect("home dir");
        let port = free_port();
        let child = Command::new(controller_bin())
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("--tokens-file")
            .arg(&tokens_file)
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("warden-controller starts");
        let mut ctl = Ctl {
            child,
            port,
            dir,
            tokens,
            seen: vec![],
        };
        wait_until("warden-controller to answer /healthz", PATIENCE, || {
            if let Ok(Some(status)) = ctl.child.try_wait() {
                panic!("warden-controller exited early: {status}");
            }
            TcpStream::connect(("127.0.0.1", port)).is_ok()
                && http(port, "GET", "/healthz", "", "text/plain", b"").0 == 200
        });
        ctl
    }

    fn server(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    /// Post a batch from `node` with a fatal XID 79 on GPU `gpu`.
    fn ingest_xid(&self, node: &str, gpu: u32, seq: u64) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_nanos() as i64;
        let batch = Batch {
            version: 0,
            node: node.into(),
            agent_id: format!("agent-{node}"),
            boot_id: "boot-1".into(),
            seq,
            sent_at_ns: now,
            jobs: vec![],
            gpus: vec![],
            events: vec![NodeEvent {
                id: seq,
                at_ns: now,
                kind: NodeEventKind::Xid as i32,
                severity: EventSeverity::Fatal as i32,
                gpu_index: Some(gpu),
                pci_bus_id: "0000:3b:00".into(),
                code: Some(79),
                message: "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.".into(),
                count: 1,
            }],
            heartbeat: Some(Heartbeat::default()),
        };
        let (status, body) = http(
            self.port,
            "POST",
            "/api/v1/ingest",
            &self.tokens.agent,
            "application/vnd.warden.batch",
            &batch.encode_binary(),
        );
        assert_eq!(status, 200, "{body}");
    }

    /// Wait until the controller lists `n` incidents.
    fn wait_for_incidents(&self, n: usize) -> Vec<Value> {
        wait_for(&format!("{n} incidents to open"), PATIENCE, || {
            let (status, body) = http(
                self.port,
                "GET",
                "/api/v1/incidents",
                &self.tokens.viewer,
                "application/json",
                b"",
            );
            assert_eq!(status, 200, "{body}");
            let list: Vec<Value> = serde_json::from_str(&body).expect("json");
            (list.len() >= n).then_some(list)
        })
    }

    /// Run `warden args...` with a clean environment plus `env`, HOME in the scratch
    /// dir; keep what it printed.
    fn warden(&mut self, args: &[&str], env: &[(&str, &str)]) -> Run {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_warden"));
        cmd.args(args).env("HOME", self.home()).stdin(Stdio::null());
        for var in [
            "WARDEN_SERVER",
            "WARDEN_TOKEN",
            "WARDEN_TOKEN_FILE",
            "WARDEN_CONFIG",
            "XDG_CONFIG_HOME",
            "RUST_LOG",
        ] {
            cmd.env_remove(var);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let run = Run::from(cmd.output().expect("warden runs"));
        self.seen.push(run.stdout.clone());
        self.seen.push(run.stderr.clone());
        run
    }

    /// `warden args... --server S` with the operator's token in `WARDEN_TOKEN`.
    fn op(&mut self, args: &[&str]) -> Run {
        let server = self.server();
        let token = self.tokens.operator.clone();
        let mut all = args.to_vec();
        all.extend(["--server", &server]);
        self.warden(&all, &[("WARDEN_TOKEN", &token)])
    }

    /// No output so far holds any token.
    fn assert_no_token_printed(&self) {
        for text in &self.seen {
            for t in self.tokens.all() {
                assert!(!text.contains(t), "a token was printed:\n{text}");
            }
            assert!(!text.contains("wdn_"), "something like a token:\n{text}");
        }
    }
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl From<Output> for Run {
    fn from(o: Output) -> Run {
        Run {
            code: o.status.code(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

impl Run {
    #[track_caller]
    fn ok(&self) -> &str {
        assert_eq!(self.code, Some(0), "{}{}", self.stdout, self.stderr);
        &self.stdout
    }

    #[track_caller]
    fn fails(&self, code: i32, needle: &str) {
        assert_eq!(self.code, Some(code), "{}{}", self.stdout, self.stderr);
        assert!(
            self.stderr.starts_with("warden: ") || self.stderr.contains("error:"),
            "{}",
            self.stderr
        );
        assert!(
            self.stderr.contains(needle),
            "{needle:?} in {}",
            self.stderr
        );
    }

    fn json(&self) -> Value {
        serde_json::from_str(self.ok()).expect("JSON output")
    }
}

#[test]
fn operators_list_show_ack_drain_undrain_and_resolve_through_the_cli() {
    let mut c = Ctl::start();
    c.ingest_xid("node-3", 3, 1);
    c.ingest_xid("node-4", 1, 1);
    let incidents = c.wait_for_incidents(2);
    let id = incidents
        .iter()
        .find(|i| i["nodes"][0] == "node-3")
        .and_then(|i| i["id"].as_str())
        .expect("an incident on node-3")
        .to_owned();

    let out = c.op(&["whoami"]);
    assert!(
        out.ok()
            .starts_with("alice (operator) at http://127.0.0.1:")
    );

    // The table: a header, aligned columns, relative times.
    let out = c.op(&["incidents", "list"]);
    let text = out.ok();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines[0].starts_with("ID ") && lines[0].contains("SUMMARY"),
        "{text}"
    );
    let col = lines[0].find("KIND").expect("KIND column");
    assert!(
        lines
            .iter()
            .skip(1)
            .all(|l| l[col..].starts_with("gpu_fault")),
        "{text}"
    );
    assert!(text.contains("ago") || text.contains("just now"), "{text}");
    assert!(text.contains(&id), "{text}");

    // JSON is the server's answer; filters go to the server.
    let json = c.op(&["incidents", "list", "--output", "json"]).json();
    assert_eq!(json.as_array().map(Vec::len), Some(2), "{json}");
    let json = c
        .op(&["incidents", "list", "--node", "node-3", "--output", "json"])
        .json();
    assert_eq!(json.as_array().map(Vec::len), Some(1), "{json}");
    assert_eq!(json[0]["id"], id.as_str());
    // (Not `--state open`: a diagnosis may move either incident on to `diagnosed` at
    // any moment.)
    let json = c
        .op(&[
            "incidents",
            "list",
            "--kind",
            "gpu_fault",
            "--output",
            "json",
        ])
        .json();
    assert_eq!(json.as_array().map(Vec::len), Some(2), "{json}");
    let json = c
        .op(&[
            "incidents",
            "list",
            "--state",
            "resolved",
            "--output",
            "json",
        ])
        .json();
    assert_eq!(json, Value::Array(vec![]));
    let out = c.op(&["incidents", "list", "--job", "nothing-here"]);
    assert_eq!(out.ok(), "no incidents\n");

    // One page, then every page.
    let out = c.op(&["incidents", "list", "--limit", "1"]);
    assert_eq!(out.ok().lines().count(), 2, "{}", out.stdout);
    assert!(
        out.stderr.contains("more incidents: --after"),
        "{}",
        out.stderr
    );
    let json = c
        .op(&[
            "incidents",
            "list",
            "--limit",
            "1",
            "--all",
            "--output",
            "json",
        ])
        .json();
    assert_eq!(json.as_array().map(Vec::len), Some(2), "{json}");

    let out = c.op(&["incidents", "show", &id]);
    let text = out.ok();
    assert!(text.starts_with(&format!("{id} — gpu_fault ")), "{text}");
    for needle in [
        "evidence:",
        "timeline:",
        "diagnosis:",
        "XID 79",
        "node-3",
        "UTC (",
    ] {
        assert!(text.contains(needle), "{needle:?} in\n{text}");
    }

    let out = c.op(&["incidents", "ack", &id, "--note", "looking at it"]);
    assert!(
        out.ok().starts_with(&format!("{id} acknowledged")),
        "{}",
        out.stdout
    );
    let json = c.op(&["incidents", "show", &id, "--output", "json"]).json();
    assert_eq!(json["acknowledged"], true, "{json}");

    let out = c.op(&["drain", "node-3", "--reason", "xid 79", "--incident", &id]);
    let text = out.ok();
    assert!(
        text.starts_with("node-3 drained by alice (xid 79, incident "),
        "{text}"
    );
    c.op(&["drain", "node-3", "--reason", "again"])
        .fails(5, "warden: 409 Conflict: ");

    let out = c.op(&["nodes"]);
    let text = out.ok();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("NODE ") && lines[0].contains("AGENT SEEN"),
        "{text}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("node-3 ") && l.contains("drained") && l.contains("alice")),
        "{text}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("node-4 ") && l.contains("ready")),
        "{text}"
    );
    let json = c.op(&["nodes", "--output", "json"]).json();
    assert_eq!(json[0]["name"], "node-3", "{json}");
    assert_eq!(json[0]["state"], "drained", "{json}");

    // The node-health ledger quarantined node-3 on the fatal XID.
    let text = c.op(&["nodes", "health", "node-3"]).ok().to_owned();
    assert!(
        text.starts_with("node-3: quarantined since ") && text.contains("held out of placement"),
        "{text}"
    );
    assert!(text.contains("XID 79"), "{text}");
    let text = c.op(&["nodes", "health"]).ok().to_owned();
    assert!(text.contains("held out of placement: node-3"), "{text}");
    let json = c
        .op(&["nodes", "health", "node-4", "--output", "json"])
        .json();
    assert_eq!(json["state"], "quarantined", "{json}");
    c.op(&["nodes", "health", "node-99"])
        .fails(4, "warden: 404 Not Found: ");

    let out = c.op(&["undrain", "node-3", "--reason", "GPU reseated"]);
    assert_eq!(out.ok(), "node-3 undrained\n");
    // A person's undrain returns it in the ledger too.
    let json = c
        .op(&["nodes", "health", "node-3", "--output", "json"])
        .json();
    assert_eq!(json["state"], "returned", "{json}");
    assert!(
        json["reason"]
            .as_str()
            .is_some_and(|r| r.contains("GPU reseated")),
        "{json}"
    );
    c.op(&["undrain", "node-3"])
        .fails(4, "warden: 404 Not Found: ");

    let out = c.op(&["incidents", "resolve", &id, "--reason", "GPU replaced"]);
    assert!(
        out.ok()
            .starts_with(&format!("{id} resolved: gpu_fault resolved")),
        "{}",
        out.stdout
    );

    c.assert_no_token_printed();
}

/// A document printed by `-o json` or `-o yaml`, parsed.
fn document(format: &str, text: &str) -> Value {
    match format {
        "json" => serde_json::from_str(text).expect("JSON output"),
        "yaml" => warden_model::yaml::from_str(text).expect("YAML output"),
        other => panic!("{other} is not a document format"),
    }
}

#[test]
fn every_command_takes_every_output_format_under_one_exit_code_scheme() {
    let mut c = Ctl::start();
    c.ingest_xid("node-7", 1, 1);
    let id = c.wait_for_incidents(1)[0]["id"]
        .as_str()
        .expect("an id")
        .to_owned();
    let reads: [&[&str]; 8] = [
        &["incidents"],
        &["incidents", "list"],
        &["incidents", "show", &id],
        &["nodes"],
        &["nodes", "health"],
        &["remediation"],
        &["remediation", "status"],
        &["whoami"],
    ];
    for (i, args) in reads.iter().enumerate() {
        for format in ["table", "wide", "json", "yaml"] {
            // `-o` and `--output` alike, before or after the subcommand's arguments.
            let mut all = args.to_vec();
            all.extend([if i % 2 == 0 { "-o" } else { "--output" }, format]);
            let run = c.op(&all);
            let text = run.ok();
            match format {
                "json" | "yaml" => {
                    let doc = document(format, text);
                    assert!(
                        doc.is_array() || doc.is_object(),
                        "{args:?} -o {format}: {text}"
                    );
                }
                _ => assert!(
                    !text.trim().is_empty(),
                    "{args:?} -o {format} printed nothing"
                ),
            }
        }
        // An unknown format is a usage error, named.
        let mut all = args.to_vec();
        all.extend(["-o", "xml"]);
        c.op(&all).fails(2, "xml");
    }
    // `incidents` alone is `incidents list`, with the list's options.
    let alone = document("json", c.op(&["incidents", "-o", "json"]).ok());
    let listed = document("json", c.op(&["incidents", "list", "-o", "json"]).ok());
    let ids = |v: &Value| -> Vec<String> {
        v.as_array()
            .expect("a list")
            .iter()
            .filter_map(|i| i["id"].as_str().map(str::to_owned))
            .collect()
    };
    assert_eq!(ids(&alone), ids(&listed));
    let none = document(
        "yaml",
        c.op(&["incidents", "--node", "node-nope", "-o", "yaml"])
            .ok(),
    );
    assert_eq!(none.as_array().map(Vec::len), Some(0), "{none}");
    // Changes print a line, or the server's answer as a document; a 204 prints nothing.
    for format in ["table", "wide", "json", "yaml"] {
        let node = format!("node-{format}");
        let text = c
            .op(&["drain", &node, "--reason", "bad fan", "-o", format])
            .ok()
            .to_owned();
        match format {
            "json" | "yaml" => assert_eq!(document(format, &text)["name"], node.as_str()),
            _ => assert!(text.starts_with(&format!("{node} drained")), "{text}"),
        }
        let text = c.op(&["undrain", &node, "-o", format]).ok().to_owned();
        match format {
            "json" | "yaml" => assert_eq!(text, "", "{format}"),
            _ => assert_eq!(text.trim(), format!("{node} undrained")),
        }
        c.op(&["undrain", &node, "-o", format])
            .fails(4, "404 Not Found");
    }
    // The local commands share the scheme: a usage error is 2, a file not found 4.
    assert_eq!(c.warden(&["diagnose", "-o", "xml"], &[]).code, Some(2));
    assert_eq!(c.warden(&["demo", "--speed", "0"], &[]).code, Some(2));
    assert_eq!(c.warden(&["sim", "--scenario"], &[]).code, Some(2));
    assert_eq!(
        c.warden(&["diagnose", "/nonexistent/rank0.log"], &[]).code,
        Some(4)
    );
    c.assert_no_token_printed();
}

#[test]
fn failures_exit_with_the_documented_codes() {
    let mut c = Ctl::start();
    let server = c.server();
    let viewer = c.tokens.viewer.clone();

    // 3: a viewer may read but not drain; no token; an unknown token.
    let as_viewer = [("WARDEN_TOKEN", viewer.as_str())];
    c.warden(&["nodes", "--server", &server], &as_viewer).ok();
    c.warden(
        &["drain", "node-1", "--reason", "r", "--server", &server],
        &as_viewer,
    )
    .fails(3, "warden: 403 Forbidden: role viewer may not POST");
    c.warden(&["whoami", "--server", &server], &[])
        .fails(3, "warden: 401 Unauthorized: a bearer token is required");
    c.warden(
        &["whoami", "--server", &server, "--token", "wdn_nobody"],
        &[],
    )
    .fails(3, "unknown token");

    // 4: no such incident.
    c.op(&["incidents", "show", "inc-nope"])
        .fails(4, "warden: 404 Not Found: no incident \"inc-nope\"");
    c.op(&["incidents", "ack", "inc-nope"])
        .fails(4, "warden: 404 Not Found: no live incident \"inc-nope\"");

    // 5: drained twice.
    c.op(&["drain", "node-1", "--reason", "first"]).ok();
    c.op(&["drain", "node-1", "--reason", "second"])
        .fails(5, "warden: 409 Conflict:");

    // 1: the server refuses a bad node name with its own message.
    c.op(&["drain", "Bad_Node", "--reason", "r"])
        .fails(1, "warden: 400 Bad Request: invalid node name \"Bad_Node\"");
    c.op(&["incidents", "list", "--kind", "meteor"])
        .fails(1, "allowed: hang, crash");

    // 2: usage: a blank reason is refused before any request, a missing one by clap.
    c.op(&["drain", "node-2", "--reason", "  "])
        .fails(2, "warden: --reason must not be empty");
    c.op(&["incidents", "resolve", "inc-1", "--reason", ""])
        .fails(2, "--reason must not be empty");
    c.op(&["drain", "node-2"]).fails(2, "--reason");
    c.op(&["incidents", "list", "--output", "xml"])
        .fails(2, "xml");
    c.warden(&["nodes", "--server", "127.0.0.1:9460"], &[])
        .fails(2, "scheme must be http or https");
    // One exit-code scheme: demo, sim and diagnose exit 2 on usage errors too.
    assert_eq!(c.warden(&["sim"], &[]).code, Some(2));
    let help = c.warden(&["drain", "--help"], &[]);
    assert!(
        help.ok().contains("3 token refused (401/403)"),
        "{}",
        help.stdout
    );

    c.assert_no_token_printed();
}

#[test]
fn remediation_status_and_a_breaker_reset_through_the_cli() {
    let mut c = Ctl::start();
    let server = c.server();
    let status = c.op(&["remediation"]);
    let text = status.ok();
    assert!(
        text.contains("remediation: dry run") && text.contains("circuit breaker: closed"),
        "{text}"
    );

    // Fatal XIDs on three nodes of three: the breaker allows one isolation per window
    // (10 % of three nodes, at least one), so the dry run trips it.
    for (seq, node) in ["node-1", "node-2", "node-3"].iter().enumerate() {
        c.ingest_xid(node, 0, seq as u64 + 1);
    }
    c.wait_for_incidents(3);
    let mut last = Value::Null;
    let tripped = poll(PATIENCE, || {
        last = c.op(&["remediation", "status", "--output", "json"]).json();
        (last["dry_run_tripped"] == true).then(|| last.clone())
    });
    let s = tripped.unwrap_or_else(|| panic!("the dry run never tripped: {last}"));
    assert_eq!(s["tripped"], false, "{s}");
    assert_eq!(s["breaker_cap"], 1, "{s}");
    let text = c.op(&["remediation"]).ok().to_owned();
    assert!(text.contains("tripped in the dry run"), "{text}");
    assert!(text.contains("  tripped at "), "{text}");

    // Only an admin resets it, with a reason; a second reset finds nothing to reset.
    c.op(&[
        "remediation",
        "reset-breaker",
        "--reason",
        "rack 4 power fixed",
    ])
    .fails(3, "warden: 403 Forbidden");
    c.op(&["remediation", "reset-breaker", "--reason", " "])
        .fails(2, "--reason must not be empty");
    let admin = c.tokens.admin.clone();
    let as_admin = [("WARDEN_TOKEN", admin.as_str())];
    let reset = c.warden(
        &[
            "remediation",
            "reset-breaker",
            "--reason",
            "rack 4 power fixed",
            "--server",
            &server,
        ],
        &as_admin,
    );
    let text = reset.ok();
    assert!(
        text.starts_with("circuit breaker reset\n") && text.contains("circuit breaker: closed"),
        "{text}"
    );
    c.warden(
        &[
            "remediation",
            "reset-breaker",
            "--reason",
            "again",
            "--server",
            &server,
        ],
        &as_admin,
    )
    .fails(5, "warden: 409 Conflict");
    let actions = c.op(&["remediation", "--output", "json"]).json();
    assert_eq!(actions["dry_run_tripped"], false, "{actions}");
    c.assert_no_token_printed();
}

#[test]
fn a_server_that_is_down_is_named() {
    let port = free_port();
    let out = Command::new(env!("CARGO_BIN_EXE_warden"))
        .args(["nodes", "--server", &format!("http://127.0.0.1:{port}")])
        .env_remove("WARDEN_CONFIG")
        .env("HOME", std::env::temp_dir().join("warden-ops-test-no-home"))
        .env("WARDEN_TOKEN", "wdn_not_shown")
        .output()
        .expect("warden runs");
    let run = Run::from(out);
    run.fails(
        1,
        &format!("warden: cannot reach the controller at http://127.0.0.1:{port}: "),
    );
    assert!(
        run.stderr.to_lowercase().contains("connection refused"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("wdn_not_shown"), "{}", run.stderr);
}

#[test]
fn tokens_come_from_flags_files_env_and_config_files_and_are_never_printed() {
    let mut c = Ctl::start();
    let server = c.server();
    let op_file = c.dir.path().join("op.token");
    std::fs::write(&op_file, format!("{}\n", c.tokens.operator)).expect("token file");
    let viewer_file = c.dir.path().join("viewer.token");
    std::fs::write(&viewer_file, &c.tokens.viewer).expect("token file");
    let op_path = op_file.to_str().expect("utf-8 path").to_owned();
    let viewer_path = viewer_file.to_str().expect("utf-8 path").to_owned();
    let operator = c.tokens.operator.clone();
    let viewer = c.tokens.viewer.clone();
    let me = ["whoami", "--server", server.as_str()];
    let who = |run: &Run| run.ok().split(' ').next().unwrap_or("").to_owned();

    // Environment: the token, or its file.
    let run = c.warden(&me, &[("WARDEN_TOKEN", &operator), ("RUST_LOG", "trace")]);
    assert_eq!(who(&run), "alice");
    let run = c.warden(&me, &[("WARDEN_TOKEN_FILE", &viewer_path)]);
    assert_eq!(who(&run), "victor");
    // Flags beat the environment.
    let run = c.warden(
        &["whoami", "--server", &server, "--token-file", &op_path],
        &[("WARDEN_TOKEN", &viewer)],
    );
    assert_eq!(who(&run), "alice");
    let run = c.warden(
        &["whoami", "--server", &server, "--token", &viewer],
        &[("WARDEN_TOKEN_FILE", &op_path)],
    );
    assert_eq!(who(&run), "victor");
    c.warden(
        &me,
        &[("WARDEN_TOKEN", &viewer), ("WARDEN_TOKEN_FILE", &op_path)],
    )
    .fails(2, "set only one");

    // The default config file, with the server and a token file relative to it.
    let conf_dir = c.home().join(".config/warden");
    std::fs::create_dir_all(&conf_dir).expect("config dir");
    std::fs::copy(&op_file, conf_dir.join("op.token")).expect("copy token");
    std::fs::write(
        conf_dir.join("cli.yaml"),
        format!("server: {server}\ntoken_file: op.token\n"),
    )
    .expect("config");
    let run = c.warden(&["whoami"], &[]);
    assert!(
        run.ok()
            .starts_with(&format!("alice (operator) at {server}")),
        "{}",
        run.stdout
    );
    // The environment beats the file.
    let run = c.warden(&["whoami"], &[("WARDEN_TOKEN", &viewer)]);
    assert_eq!(who(&run), "victor");

    // --config and WARDEN_CONFIG name another file; `token:` works too.
    let other = c.dir.path().join("other.yaml");
    std::fs::write(&other, format!("server: {server}\ntoken: {viewer}\n")).expect("config");
    let other_path = other.to_str().expect("utf-8 path").to_owned();
    let run = c.warden(&["whoami", "--config", &other_path], &[]);
    assert_eq!(who(&run), "victor");
    let run = c.warden(&["whoami"], &[("WARDEN_CONFIG", &other_path)]);
    assert_eq!(who(&run), "victor");

    // Broken files name the file, never the token.
    std::fs::write(&other, format!("server: {server}\ntokn: {viewer}\n")).expect("config");
    c.warden(&["whoami", "--config", &other_path], &[])
        .fails(2, "field `tokn`: unknown field");
    c.warden(&["whoami", "--config", "/nonexistent/cli.yaml"], &[])
        .fails(2, "/nonexistent/cli.yaml: cannot read the file");
    c.warden(&["whoami", "--token-file", "/nonexistent/token"], &[])
        .fails(2, "cannot read the token file /nonexistent/token");
    let empty = c.dir.path().join("empty.token");
    std::fs::write(&empty, "\n").expect("empty token file");
    c.warden(
        &[
            "whoami",
            "--token-file",
            empty.to_str().expect("utf-8 path"),
        ],
        &[],
    )
    .fails(2, "is empty");

    c.assert_no_token_printed();
}

/// `warden loadgen` against the real controller, in real time: a 64-rank job whose rank
/// 29 stops in its third step (`sim/scenarios/hang-first-steps.yaml`) for 15 s. Every
/// batch is accepted (none dropped, no 503, no other status), the controller counted
/// the events, its CPU seconds (whole seconds: none in so short a run) and memory are
/// read from its `/metrics`, and the simulator's scorer finds the hang matched by one
/// incident naming exactly rank 29, within 10 s of the last collective completion
/// anywhere (the detector's own bound is checked by the scenario suite), and no other
/// incident. Neither token is printed; options out of range and an
/// unreadable agent token file exit 2 naming the option.
#[test]
fn loadgen_drives_a_real_controller_in_real_time_and_reads_back_the_hang() {
    let mut ctl = Ctl::start();
    let dir = ctl.dir.path().to_path_buf();
    let agent_file = dir.join("agent.token");
    std::fs::write(&agent_file, format!("{}\n", ctl.tokens.agent)).expect("agent token");
    let viewer_file = dir.join("viewer.token");
    std::fs::write(&viewer_file, format!("{}\n", ctl.tokens.viewer)).expect("viewer token");
    let scenario =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../sim/scenarios/hang-first-steps.yaml");
    let report = dir.join("load.json");
    let server = ctl.server();
    let (scenario, agent_file, viewer_file, report_arg) = (
        scenario.display().to_string(),
        agent_file.display().to_string(),
        viewer_file.display().to_string(),
        report.display().to_string(),
    );
    let base = [
        "loadgen",
        "--controller",
        &server,
        "--scenario",
        &scenario,
        "--agent-token-file",
        &agent_file,
        "--token-file",
        &viewer_file,
    ];
    let mut args = base.to_vec();
    args.extend(["--seconds", "15", "--report", &report_arg]);
    let out = ctl.warden(&args, &[]).ok().to_owned();
    assert!(out.contains("hang"), "{out}");
    let r: Value =
        serde_json::from_slice(&std::fs::read(&report).expect("the report")).expect("JSON");
    let n = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} in {r}"));
    assert!(n("batches_ok") > 0, "{r}");
    assert_eq!(n("batches_ok"), n("batches_offered"), "{r}");
    assert_eq!(n("batches_dropped"), 0, "{r}");
    assert_eq!(n("busy_503"), 0, "{r}");
    assert_eq!(n("unreachable"), 0, "{r}");
    assert_eq!(r["other_statuses"], serde_json::json!({}), "{r}");
    assert!(r["events_per_s"].as_f64().is_some_and(|e| e > 0.0), "{r}");
    assert!(
        r["controller_cpu_seconds"]
            .as_f64()
            .is_some_and(|c| c >= 0.0),
        "{r}"
    );
    assert!(
        r["after"]["rss_bytes"].as_f64().is_some_and(|b| b > 0.0),
        "{r}"
    );
    // Graded as `warden sim` grades a run: the one fault found by an incident naming
    // exactly rank 29, and no incident that matches no fault.
    let score = &r["score"];
    assert_eq!(
        (&score["faults"], &score["matched"], &score["incidents"]),
        (
            &serde_json::json!(1),
            &serde_json::json!(1),
            &serde_json::json!(1)
        ),
        "{r}"
    );
    assert_eq!(score["missed"], serde_json::json!([]), "{r}");
    assert_eq!(score["false_positives"], serde_json::json!([]), "{r}");
    let hang = score["classes"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["class"] == "hang"))
        .unwrap_or_else(|| panic!("the hang's class: {r}"));
    let latency = hang["latencies"][0]["secs"].as_f64().expect("a latency");
    assert!(
        (0.0..=10.0).contains(&latency),
        "found {latency} s after the last progress: {r}"
    );

    for (flag, value, needle) in [
        ("--speed", "0", "--speed"),
        ("--seconds", "0", "--seconds"),
        ("--queue", "0", "--queue"),
    ] {
        let mut bad = base.to_vec();
        bad.extend([flag, value]);
        let run = ctl.warden(&bad, &[]);
        assert_eq!(run.code, Some(2), "{}{}", run.stdout, run.stderr);
        assert!(run.stderr.contains(needle), "{}", run.stderr);
    }
    let missing = dir.join("no-such-token").display().to_string();
    let mut bad = base.to_vec();
    bad[6] = &missing;
    let run = ctl.warden(&bad, &[]);
    assert_eq!(run.code, Some(2), "{}{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("--agent-token-file"), "{}", run.stderr);
    ctl.assert_no_token_printed();
}
