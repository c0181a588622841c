//! Outside programs the tests drive (promtool, helm): found, or, outside CI, skipped with
//! advice; under CI (`CI=true`) a missing one is a failure, never a skip.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Whether `bin ARGS` runs and exits 0.
fn runs(bin: &Path, args: &[&str]) -> bool {
    Command::new(bin)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `None` after saying what was not checked, or, under CI, a failed test.
fn missing(tool: &str, hint: &str) -> Option<PathBuf> {
    assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "{hint}");
    eprintln!("NOT CHECKED with {tool}: {hint}");
    None
}

/// `promtool` (or `$PROMTOOL`) when it runs, else `None` with advice on stderr; under
/// CI a missing promtool fails the test.
pub fn promtool() -> Option<PathBuf> {
    let bin = std::env::var_os("PROMTOOL").map_or_else(|| PathBuf::from("promtool"), PathBuf::from);
    if runs(&bin, &["--version"]) {
        return Some(bin);
    }
    missing(
        "promtool",
        "promtool is not installed: apt-get install --no-install-recommends prometheus \
         (scripts/test does it), or set PROMTOOL to its path",
    )
}

/// `helm` when it runs: `$WARDEN_HELM` when set (and then only that), else
/// `$HOME/.cache/warden/bin/helm` (where scripts/test installs the pinned version), else
/// `helm` on the PATH. Else `None` with advice on stderr; under CI a missing helm fails
/// the test.
pub fn helm() -> Option<PathBuf> {
    let candidates: Vec<PathBuf> = match std::env::var_os("WARDEN_HELM") {
        Some(p) if !p.is_empty() => vec![PathBuf::from(p)],
        _ => std::env::var_os("HOME")
            .map(|h| PathBuf::from(h).join(".cache/warden/bin/helm"))
            .into_iter()
            .chain([PathBuf::from("helm")])
            .collect(),
    };
    if let Some(bin) = candidates.iter().find(|b| runs(b, &["version"])) {
        return Some(bin.clone());
    }
    let tried: Vec<String> = candidates.iter().map(|c| c.display().to_string()).collect();
    missing(
        "helm",
        &format!(
            "helm does not run (tried {}): scripts/test installs it as \
             ~/.cache/warden/bin/helm, or set WARDEN_HELM to its path",
            tried.join(", ")
        ),
    )
}

/// The project's Python virtualenv: `$WARDEN_VENV`, else `$HOME/.cache/warden/venv`
/// (where scripts/test makes it).
pub fn venv() -> PathBuf {
    match std::env::var_os("WARDEN_VENV") {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => std::env::var_os("HOME")
            .map_or_else(|| PathBuf::from("/nonexistent"), PathBuf::from)
            .join(".cache/warden/venv"),
    }
}

/// The virtualenv's Python when it can import `module`, else `None` with advice on
/// stderr; under CI a missing one fails the test.
pub fn venv_python(module: &str) -> Option<PathBuf> {
    let py = venv().join("bin/python");
    if runs(&py, &["-c", &format!("import {module}")]) {
        return Some(py);
    }
    missing(
        &format!("Python's {module}"),
        &format!(
            "{} cannot import {module}: run scripts/test, which installs it, or set \
             WARDEN_VENV to a virtualenv that has it",
            py.display()
        ),
    )
}
