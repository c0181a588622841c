//! A binary whose stdout nobody reads (`warden ... | head`): run it into a closed pipe
//! and check that it ended quietly, the one way every binary's test does it.

use std::process::{Command, Output};

/// Run `cmd` with stdout a pipe whose reading end is already closed: its first write
/// fails with EPIPE, every time.
pub fn into_a_closed_pipe(cmd: &mut Command) -> Output {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    cmd.stdout(writer).output().expect("runs")
}

/// Assert that `out` (of `what`) ended with status 0 and no panic on stderr.
#[track_caller]
pub fn assert_quiet_end(what: &str, out: &Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{what} panicked:\n{stderr}");
    assert_eq!(out.status.code(), Some(0), "{what}:\n{stderr}");
}
