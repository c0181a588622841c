//! The `warden` binary when nobody reads its stdout (`warden sim ... | head`): every
//! command ends quietly with status 0, never with a panic's backtrace.

use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use warden_testkit::pipe::{assert_quiet_end, into_a_closed_pipe};

fn warden(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_warden"));
    c.args(args)
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    c
}

fn scenario(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../sim/scenarios")
        .join(name);
    p.to_str().expect("utf8 path").to_owned()
}

#[test]
fn sim_into_a_closed_stdout_ends_quietly() {
    let out = into_a_closed_pipe(&mut warden(&[
        "sim",
        "--scenario",
        &scenario("xid-79-fallen-off-bus.yaml"),
    ]));
    assert_quiet_end("sim", &out);
}

#[test]
fn version_and_help_into_a_closed_stdout_end_quietly() {
    for args in [&["version"][..], &["--help"], &["sim", "--help"]] {
        assert_quiet_end(&args.join(" "), &into_a_closed_pipe(&mut warden(args)));
    }
}

#[test]
fn diagnose_into_a_closed_stdout_ends_quietly() {
    let dir = std::env::temp_dir().join(format!("warden-cli-closed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let log = dir.join("rank0.log");
    std::fs::write(
        &log,
        "[rank0]: RuntimeError: CUDA error: an illegal memory access was encountered\n",
    )
    .expect("write log");
    let path = log.to_str().expect("utf8 path");
    for json in [false, true] {
        let mut args = vec!["diagnose", path];
        if json {
            args.push("--json");
        }
        assert_quiet_end(&args.join(" "), &into_a_closed_pipe(&mut warden(&args)));
    }
}

#[test]
fn demo_into_a_closed_stdout_stops_quietly() {
    // Once stdout cannot be written the demo stops at its next step (removing its data
    // directory on the way out) instead of panicking or running on.
    let out = into_a_closed_pipe(&mut warden(&["demo", "--speed", "1000", "--no-api"]));
    assert_quiet_end("demo", &out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr
        .lines()
        .rev()
        .find(|l| l.starts_with("step "))
        .expect("a progress line");
    assert!(!last.starts_with("step 360/"), "ran to its end: {stderr}");
}

/// A controller stand-in on loopback that answers every request with `body` (JSON), for
/// `requests` requests; its URL.
fn canned_server(body: &'static str, requests: usize) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    std::thread::spawn(move || {
        for stream in listener.incoming().take(requests) {
            let Ok(mut s) = stream else { continue };
            let mut seen = Vec::new();
            let mut buf = [0; 1024];
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    url
}

#[test]
fn operator_commands_into_a_closed_stdout_end_quietly() {
    let who = r#"{"name":"ci","role":"viewer"}"#;
    for output in ["table", "json"] {
        let server = canned_server(who, 1);
        let args = [
            "whoami", "--server", &server, "--token", "t", "--output", output,
        ];
        assert_quiet_end(&args.join(" "), &into_a_closed_pipe(&mut warden(&args)));
    }
    let server = canned_server("[]", 1);
    let args = ["nodes", "--server", &server, "--token", "t"];
    assert_quiet_end("nodes", &into_a_closed_pipe(&mut warden(&args)));
}
