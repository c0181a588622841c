//! https between the agent and the controller: the real `warden-controller` serves its
//! API with a certificate signed by a private CA (made by `openssl` for the test), the
//! real `warden-agent` ships to it with that CA in `controller.ca_file`, and batches
//! arrive; plain http to the TLS port gets no answer, and an agent without the CA
//! delivers nothing.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::{AgentProc, free_port, metric};

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
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n",
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

#[test]
fn the_agent_ships_over_https_to_a_controller_with_a_private_ca() {
    let dir = tempfile::tempdir().expect("temp dir");
    certificates(dir.path());
    let port = free_port();
    let cfg = dir.path().join("controller.yaml");
    std::fs::write(
        &cfg,
        format!(
            "listen: 127.0.0.1:{port}\ntls:\n  cert_file: {}\n  key_file: {}\n",
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
    let deadline = Instant::now() + Duration::from_secs(20);
    while https("/healthz").is_none() {
        assert!(
            Instant::now() < deadline,
            "the controller never answered over https"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
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
    let deadline = Instant::now() + Duration::from_secs(20);
    while batches() < 3.0 {
        assert!(Instant::now() < deadline, "no batch arrived over https");
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(with_ca);

    // Without the CA the agent cannot verify the controller and delivers nothing.
    let before = batches();
    let without = agent(dir.path(), "node-b", port, None);
    std::thread::sleep(Duration::from_secs(2));
    let m = without.scrape().expect("agent metrics");
    assert_eq!(batches(), before, "an unverified controller got batches");
    assert!(
        metric(&m, "warden_agent_batches_sent_total").unwrap_or(0.0) == 0.0,
        "the agent reports nothing sent"
    );
}
