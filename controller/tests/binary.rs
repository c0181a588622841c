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
