//! The `warden-controller` binary when nobody reads its stdout (`warden-controller
//! openapi | head`): it ends quietly with status 0, never with a panic's backtrace.

use std::io::Read as _;
use std::process::{Command, Stdio};

use warden_testkit::pipe::{assert_quiet_end, into_a_closed_pipe};

fn controller(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_warden-controller"));
    c.args(args)
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    c
}

#[test]
fn openapi_into_a_closed_stdout_ends_quietly() {
    assert_quiet_end(
        "openapi",
        &into_a_closed_pipe(&mut controller(&["openapi"])),
    );
}

#[test]
fn openapi_read_in_part_ends_quietly() {
    // The document is larger than a pipe's buffer: the rest is written after the reader
    // has gone.
    let mut child = controller(&["openapi"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("runs");
    let mut head = [0; 64];
    child
        .stdout
        .take()
        .expect("stdout")
        .read_exact(&mut head)
        .expect("the first bytes");
    assert!(head.starts_with(b"{"), "{}", String::from_utf8_lossy(&head));
    let out = child.wait_with_output().expect("exits");
    assert_quiet_end("openapi | head -c 64", &out);
}

#[test]
fn token_into_a_closed_stdout_ends_quietly() {
    let out = into_a_closed_pipe(&mut controller(&[
        "token", "--name", "ci", "--role", "viewer",
    ]));
    assert_quiet_end("token", &out);
}
