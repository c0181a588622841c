//! The `warden-controller` binary: configuration errors exit 64 before any port is
//! bound, and every error is named.

use std::process::Command;

fn controller() -> Command {
    Command::new(env!("CARGO_BIN_EXE_warden-controller"))
}

#[test]
fn bad_config_exits_64_naming_every_field() {
    let dir = std::env::temp_dir().join(format!("warden-controller-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("bad.yaml");
    std::fs::write(
        &path,
        "listen: 127.0.0.1:0\nlisen: x\ntick_interval_ms: 1\n",
    )
    .expect("write");

    // Hold a port: a controller that got past configuration would try to bind it.
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = held.local_addr().expect("addr").to_string();
    let out = controller()
        .args(["--config", path.to_str().expect("utf8"), "--listen", &addr])
        .env("WARDEN_MAX_BATCH_BYTES", "huge")
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    for needle in [
        "`lisen`",
        "`max_batch_bytes`",
        "WARDEN_MAX_BATCH_BYTES",
        "`tick_interval_ms`",
    ] {
        assert!(stderr.contains(needle), "{needle} missing from: {stderr}");
    }
    assert!(!stderr.contains("cannot listen"), "{stderr}");
}

#[test]
fn bad_listen_flag_exits_64() {
    let out = controller()
        .args(["--listen", "localhost"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("flag --listen: field `listen`"), "{stderr}");
}

/// Start the controller with `args`, read its stderr until a line holds `until` (or 60 s
/// pass), stop it, and return what it printed.
fn stderr_until(args: &[&str], until: &str) -> String {
    use std::io::BufRead;
    let mut child = controller()
        .args(args)
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("runs");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut seen = String::new();
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(line) => {
                seen.push_str(&line);
                seen.push('\n');
                if line.contains(until) {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    seen
}

#[test]
fn a_new_store_is_announced_with_its_path_and_a_kept_one_is_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("state");
    let data = data.to_str().expect("utf8");
    let args = ["--listen", "127.0.0.1:0", "--data-dir", data];
    let first = stderr_until(&args, "serving");
    assert!(
        first.contains("created a new incident store") && first.contains("warden.db"),
        "{first}"
    );
    assert!(first.contains("WARN"), "{first}");
    // Redirected stderr carries no colour codes.
    assert!(!first.contains('\u{1b}'), "{first:?}");
    let second = stderr_until(&args, "serving");
    assert!(second.contains("incident store open"), "{second}");
    assert!(!second.contains("created a new"), "{second}");
}
