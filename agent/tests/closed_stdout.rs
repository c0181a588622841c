//! The `warden-agent` binary when nobody reads its stdout (`warden-agent --check-config
//! | head`): it ends quietly with status 0, never with a panic's backtrace.

use std::process::{Command, Stdio};

use warden_testkit::pipe::{assert_quiet_end, into_a_closed_pipe};

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

#[test]
fn check_config_into_a_closed_stdout_ends_quietly() {
    let out = into_a_closed_pipe(agent().arg("--check-config"));
    assert_quiet_end("--check-config", &out);
}
