//! The `warden-agent` binary when nobody reads its stdout (`warden-agent --check-config
//! | head`): it ends quietly with status 0, never with a panic's backtrace.

use std::process::{Command, Output, Stdio};

fn agent() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_warden-agent"));
    // No configuration from the environment of whoever runs the tests.
    c.env_remove("WARDEN_AGENT_CONFIG")
        .env_remove("RUST_LOG")
        .env("RUST_BACKTRACE", "1")
        .args(["--node-name", "gpu-1"])
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    c
}

/// Run `cmd` with stdout a pipe whose reading end is already closed: its first write
/// fails with EPIPE, every time.
fn into_a_closed_pipe(cmd: &mut Command) -> Output {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    cmd.stdout(writer).output().expect("runs")
}

fn assert_quiet_end(what: &str, out: &Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{what} panicked:\n{stderr}");
    assert_eq!(out.status.code(), Some(0), "{what}:\n{stderr}");
}

#[test]
fn check_config_into_a_closed_stdout_ends_quietly() {
    let out = into_a_closed_pipe(agent().arg("--check-config"));
    assert_quiet_end("--check-config", &out);
}
