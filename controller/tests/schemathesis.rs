//! schemathesis (PyPI) fuzzes the real `warden-controller` binary against the committed
//! OpenAPI document: every operation, with examples, boundary and negative cases and
//! random inputs, authenticated as an admin; any server error, undocumented status,
//! wrong content type, missing documented header or answer that breaks its schema fails
//! the test.
//!
//! schemathesis lives in the project's virtualenv, `$WARDEN_VENV` (default
//! `~/.cache/warden/venv`), where scripts/test installs it; `SCHEMATHESIS` names another
//! executable. Under `CI=true` a missing schemathesis is a failure; elsewhere the test
//! says so and passes.

mod support;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use support::Controller;

/// Test cases per operation and phase: enough to reach odd inputs everywhere, few
/// enough to finish in a minute or two on two cores.
const MAX_EXAMPLES: &str = "100";

/// Fixed seed, so a run can be repeated exactly.
const SEED: &str = "20260101";

/// What schemathesis checks on every answer.
const CHECKS: &str = "not_a_server_error,status_code_conformance,content_type_conformance,\
                      response_headers_conformance,response_schema_conformance";

fn in_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// The schemathesis executable, or `None` (with advice) outside CI when it is missing.
fn schemathesis_bin() -> Option<PathBuf> {
    let bin = std::env::var_os("SCHEMATHESIS")
        .map(PathBuf::from)
        .unwrap_or_else(|| warden_testkit::tools::venv().join("bin/schemathesis"));
    let works = Command::new(&bin)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if works {
        return Some(bin);
    }
    let hint = format!(
        "schemathesis is not installed at {}: run scripts/test (it installs it into \
         $WARDEN_VENV), or set SCHEMATHESIS to its path",
        bin.display()
    );
    assert!(!in_ci(), "{hint}");
    eprintln!(
        "\n*** SKIPPING schemathesis: {hint} ***\n*** (under CI=true this is a failure) ***\n"
    );
    None
}

/// The controller binary with one admin token (in `dir`).
fn start_controller(token: &str, dir: &std::path::Path) -> Controller {
    let tokens = dir.join("tokens.yaml");
    std::fs::write(
        &tokens,
        format!(
            "tokens:\n  - name: schemathesis\n    role: admin\n    sha256: {}\n",
            warden_controller::auth::hash_token(token)
        ),
    )
    .expect("write the token file");
    Controller::start_with(&[std::ffi::OsStr::new("--tokens-file"), tokens.as_os_str()])
}

#[test]
fn schemathesis_finds_no_server_error_and_no_schema_violation() {
    let Some(bin) = schemathesis_bin() else {
        return;
    };
    let doc = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json");
    let token = "wdn_schemathesis_test_token";
    let tokens_dir = tempfile::tempdir().expect("temp dir");
    let controller = start_controller(token, tokens_dir.path());
    // Its own working directory: schemathesis and Hypothesis write nothing into the
    // repository.
    let work = tempfile::tempdir().expect("temp dir");
    let started = Instant::now();
    let out = Command::new(&bin)
        .current_dir(work.path())
        .arg("run")
        .arg(&doc)
        .args(["--url", &format!("http://127.0.0.1:{}", controller.port)])
        .args(["--header", &format!("Authorization: Bearer {token}")])
        .args(["--checks", CHECKS])
        .args(["--phases", "examples,coverage,fuzzing"])
        .args(["--max-examples", MAX_EXAMPLES])
        .args(["--seed", SEED])
        .args(["--workers", "2"])
        .args(["--request-timeout", "10"])
        .args(["--generation-database", "none"])
        .arg("--no-color")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .expect("schemathesis runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "schemathesis ran {:.0} s\n{stdout}\n{stderr}",
        started.elapsed().as_secs_f64()
    );
    assert!(
        out.status.success(),
        "schemathesis reported failures (exit {:?}); its report is above",
        out.status.code()
    );
}
