//! https between the agent and the controller: the real `warden-controller` serves its
//! API with a certificate signed by a private CA (made by `openssl` for the test), the
//! real `warden-agent` ships to it with that CA in `controller.ca_file`, and batches
//! arrive; plain http to the TLS port gets no answer, and an agent without the CA
//! delivers nothing; nor does one whose controller shows a certificate the CA signed
//! for another name. At trace level, the agent's token is in none of its log lines,
//! whether the controller refuses it or a caller of its log API brings a wrong one.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::{AgentProc, free_port, metric};
use warden_testkit::{PATIENCE, wait_for, wait_until};

fn controller_bin() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_warden-agent")).with_file_name("warden-controller");
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build -p warden-controller` (same profile)",
        bin.display()
    );
    bin
}

fn openssl(dir: &Path, args: &[&str]) {
    let ok = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .status()
        .unwrap_or_else(|e| panic!("openssl is needed to make test certificates: {e}"));
    assert!(ok.success(), "openssl {args:?}");
}

/// A CA, and a server certificate for 127.0.0.1 and localhost signed by it.
fn certificates(dir: &Path) {
    certificates_for(dir, "subjectAltName=IP:127.0.0.1,DNS:localhost");
}

/// A CA, and a server certificate with `san` signed by it (`server.pem`, `server.key`).
fn certificates_for(dir: &Path, san: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=warden test CA",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ],
    );
    std::fs::write(
        dir.join("san.ext"),
        format!("{san}\nbasicConstraints=CA:FALSE\n"),
    )
    .expect("ext file");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ],
    );
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn agent(dir: &Path, name: &str, port: u16, ca: Option<&Path>) -> AgentProc {
    let ca_line = ca.map_or_else(String::new, |c| format!("  ca_file: {}\n", c.display()));
    let url = format!("https://localhost:{port}");
    let (cfg, agent_port) = support::agent_config(dir, name, &url, &ca_line);
    AgentProc::start(&cfg, agent_port)
}

/// The controller on `port` serving https with `server.pem` / `server.key` of `dir`.
fn https_controller(dir: &Path, port: u16) -> Killed {
    let cfg = dir.join("controller.yaml");
    std::fs::write(
        &cfg,
        format!(
            "listen: 127.0.0.1:{port}\ntls:\n  cert_file: {}\n  key_file: {}\n",
            dir.join("server.pem").display(),
            dir.join("server.key").display()
        ),
    )
    .expect("config");
    Killed(
        Command::new(controller_bin())
            .arg("--config")
            .arg(&cfg)
            .arg("--data-dir")
            .arg(dir.join("data"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("controller starts"),
    )
}

#[test]
fn the_agent_ships_over_https_to_a_controller_with_a_private_ca() {
    let dir = tempfile::tempdir().expect("temp dir");
    certificates(dir.path());
    let port = free_port();
    let _controller = https_controller(dir.path(), port);
    // Over https with the CA: /metrics answers (curl trusts the CA explicitly).
    let https = |path: &str| {
        Command::new("curl")
            .args(["-sS", "--max-time", "5", "--cacert"])
            .arg(dir.path().join("ca.pem"))
            .arg(format!("https://localhost:{port}{path}"))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    wait_until("the controller to answer over https", PATIENCE, || {
        https("/healthz").is_some()
    });
    // Plain http to the TLS port gets no HTTP answer.
    assert!(
        support::http_get(port, "/healthz").is_none_or(|body| !body.contains("ok")),
        "plain http must not be served"
    );

    let batches = || {
        https("/metrics")
            .and_then(|m| metric(&m, "warden_ingest_batches_total"))
            .unwrap_or(0.0)
    };
    let with_ca = agent(dir.path(), "node-a", port, Some(&dir.path().join("ca.pem")));
    wait_until("three batches to arrive over https", PATIENCE, || {
        batches() >= 3.0
    });
    drop(with_ca);

    // Without the CA the agent cannot verify the controller and delivers nothing. Its
    // failed attempts are the barrier: once it has tried twice, it would have delivered.
    let without = agent(dir.path(), "node-b", port, None);
    let m = without.wait_metric("warden_agent_batches_failed_total", |n| n >= 2.0);
    assert!(
        metric(&m, "warden_agent_batches_sent_total").unwrap_or(0.0) == 0.0,
        "the agent reports nothing sent: {m}"
    );
    // The controller's node list, not its batch count: a batch node-a sent just before
    // it was stopped may still be counted after any reading taken here.
    let nodes = wait_for("the controller's node list over https", PATIENCE, || {
        https("/api/v1/nodes")
    });
    assert!(nodes.contains("\"node-a\""), "{nodes}");
    assert!(
        !nodes.contains("\"node-b\""),
        "an unverified controller got batches: {nodes}"
    );
}

#[test]
fn the_agent_delivers_nothing_to_a_certificate_for_another_name() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Signed by the CA the agent trusts, but for another host than the one it dials.
    certificates_for(dir.path(), "subjectAltName=DNS:other.example");
    let port = free_port();
    let _controller = https_controller(dir.path(), port);
    // curl reaches it under the certificate's own name.
    let https = |path: &str| {
        Command::new("curl")
            .args(["-sS", "--max-time", "5", "--cacert"])
            .arg(dir.path().join("ca.pem"))
            .args(["--resolve", &format!("other.example:{port}:127.0.0.1")])
            .arg(format!("https://other.example:{port}{path}"))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    wait_until("the controller to answer over https", PATIENCE, || {
        https("/healthz").is_some()
    });
    // The agent dials https://localhost with the right CA: the name does not match.
    // Its failed attempts are the barrier: once it has tried twice, it would have
    // delivered.
    let a = agent(dir.path(), "node-a", port, Some(&dir.path().join("ca.pem")));
    let m = a.wait_metric("warden_agent_batches_failed_total", |n| n >= 2.0);
    assert_eq!(
        metric(&m, "warden_agent_batches_sent_total").unwrap_or(0.0),
        0.0,
        "the agent delivered to a certificate for another name: {m}"
    );
    let controller = wait_for("the controller's /metrics over https", PATIENCE, || {
        https("/metrics")
    });
    let got = metric(&controller, "warden_ingest_batches_total").unwrap_or(0.0);
    assert_eq!(got, 0.0, "the controller got batches");
}

/// `GET path` on 127.0.0.1:`port` with `headers` (each ending in CRLF): the status.
fn get_status(port: u16, path: &str, headers: &str) -> u16 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}Connection: close\r\n\r\n"
    )
    .expect("write");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read");
    text.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status")
}

#[test]
fn the_agents_token_is_in_no_log_line_at_trace_level() {
    let dir = tempfile::tempdir().expect("temp dir");
    certificates(dir.path());
    let token = "wdn_7a6b5c4d3e2f10897a6b5c4d3e2f10897a6b5c4d3e2f10897a6b5c4d3e2f1089";
    let wrong = "wdn_00000000000000000000000000000000000000000000000000000000000000ff";
    std::fs::write(dir.path().join("agent-token"), format!("{token}\n")).expect("token");
    // The controller knows another token only: it refuses every batch with 401.
    let digest = "0".repeat(64);
    std::fs::write(
        dir.path().join("tokens.yaml"),
        format!("tokens:\n  - name: someone\n    role: agent\n    sha256: {digest}\n"),
    )
    .expect("token file");
    let port = free_port();
    let cfg = dir.path().join("controller.yaml");
    std::fs::write(
        &cfg,
        format!(
            "listen: 127.0.0.1:{port}\ntokens_file: {}\ntls:\n  cert_file: {}\n  key_file: {}\n",
            dir.path().join("tokens.yaml").display(),
            dir.path().join("server.pem").display(),
            dir.path().join("server.key").display()
        ),
    )
    .expect("config");
    let _controller = Killed(
        Command::new(controller_bin())
            .arg("--config")
            .arg(&cfg)
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("controller starts"),
    );
    // Every delivery must reach the controller to be refused with a 401: one made
    // before it listens fails to connect instead.
    let listening = warden_testkit::poll(PATIENCE, || {
        std::net::TcpStream::connect(("127.0.0.1", port)).ok()
    });
    assert!(
        listening.is_some(),
        "the controller never listened on {port}"
    );
    let extra = format!(
        "  ca_file: {}\n  token_file: {}\n",
        dir.path().join("ca.pem").display(),
        dir.path().join("agent-token").display()
    );
    let url = format!("https://localhost:{port}");
    let (agent_cfg, agent_port) = support::agent_config(dir.path(), "node-a", &url, &extra);
    let (agent, output) = AgentProc::start_captured(&agent_cfg, agent_port, "trace");
    // Its log API: refused without the token and with a wrong one, served with it.
    let logs = "/api/v1/logs?around=0&before_secs=1&after_secs=1";
    assert_eq!(get_status(agent_port, logs, ""), 401);
    let bearer = |t: &str| format!("Authorization: Bearer {t}\r\n");
    assert_eq!(get_status(agent_port, logs, &bearer(wrong)), 401);
    assert_eq!(get_status(agent_port, logs, &bearer(token)), 200);
    // Batches go out and are refused for a while. The agent logs a refusal before it
    // counts it.
    agent.wait_metrics("two refused deliveries", |m| {
        let failed: f64 = m
            .lines()
            .filter(|l| l.starts_with("warden_agent_batches_failed_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        failed >= 2.0
    });
    drop(agent);
    let text = output.join().expect("agent output");
    assert!(text.contains("TRACE"), "trace logging was on");
    assert!(text.contains("401"), "the refusal was logged: {text}");
    for (what, secret) in [("its token", token), ("the wrong token", wrong)] {
        let hit = text.lines().find(|l| l.contains(secret));
        assert!(hit.is_none(), "{what} is in the agent's output: {hit:?}");
    }
}
