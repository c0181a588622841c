//! Outside programs the tests drive (promtool): found, or, outside CI, skipped with
//! advice; under CI (`CI=true`) a missing one is a failure, never a skip.

use std::path::PathBuf;
use std::process::Command;

/// `promtool` (or `$PROMTOOL`) when it runs, else `None` with advice on stderr; under
/// CI a missing promtool fails the test.
pub fn promtool() -> Option<PathBuf> {
    let bin = std::env::var_os("PROMTOOL").map_or_else(|| PathBuf::from("promtool"), PathBuf::from);
    if Command::new(&bin)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Some(bin);
    }
    let hint = "promtool is not installed: apt-get install --no-install-recommends prometheus \
                (scripts/test does it), or set PROMTOOL to its path";
    assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "{hint}");
    eprintln!("NOT CHECKED with promtool: {hint}");
    None
}
