//! Builds the fake `libnvidia-ml.so.1` from `fake_nvml.c` and gives each test its own
//! copy of it with its own state file, so that tests in one process do not share GPUs.
//!
//! Use from a test or a bench with
//! `#[path = "fake_nvml/mod.rs"] mod fake_nvml;` (from `tests/`) or
//! `#[path = "../tests/fake_nvml/mod.rs"] mod fake_nvml;` (from `benches/`), then
//! `let node = FakeNode::new(&[]); node.set("gpu.3.temp", "91");` and open
//! `NvmlSource` with `lib_path: Some(node.lib_path().to_owned())`.
#![allow(dead_code)]

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// The C source of the fake library.
pub const SOURCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fake_nvml/fake_nvml.c");

/// Compile the fake library, leaving out the entry points in `omit` (e.g.
/// `"nvmlDeviceGetPowerUsage"`), once per variant and process. Panics with the
/// compiler's output when it does not compile: a broken fake is a failed test.
pub fn build(omit: &[&str]) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<Vec<String>, PathBuf>>> = OnceLock::new();
    let key: Vec<String> = omit.iter().map(|s| (*s).to_owned()).collect();
    let mut built = BUILT
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(path) = built.get(&key) {
        return path.clone();
    }
    let variant = if omit.is_empty() {
        "full".to_owned()
    } else {
        format!("omit-{}", omit.join("-"))
    };
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("fake-nvml")
        .join(variant);
    fs::create_dir_all(&dir).expect("create the fake NVML build directory");
    let out = dir.join("libnvidia-ml.so.1");
    // Test binaries may build at the same time: compile under a name of this
    // process's own, then rename into place (a copy being read keeps the old file).
    let tmp = dir.join(format!("libnvidia-ml.so.1.{}", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let mut cmd = Command::new(&cc);
    cmd.args(["-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-o"])
        .arg(&tmp)
        .arg(SOURCE);
    for symbol in omit {
        cmd.arg(format!("-DOMIT_{symbol}"));
    }
    cmd.arg("-lpthread");
    let result = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc:?}: {e}"));
    assert!(
        result.status.success(),
        "fake NVML does not compile ({cmd:?}):\n{}",
        String::from_utf8_lossy(&result.stderr)
    );
    fs::rename(&tmp, &out).expect("move the fake NVML library into place");
    built.insert(key, out.clone());
    out
}

/// One fake GPU node: a private copy of the fake library (a copy, not a link: the
/// dynamic loader then loads it as a library of its own, with its own GPUs) and the
/// state file next to it, `fake_nvml.state`, which the library reads.
#[derive(Debug)]
pub struct FakeNode {
    dir: tempfile::TempDir,
    lib: PathBuf,
    lines: Mutex<Vec<(String, String)>>,
}

impl FakeNode {
    /// A node with the library variant leaving out `omit`, and 8 GPUs with the
    /// library's default readings.
    pub fn new(omit: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory for the fake node");
        let lib = dir.path().join("libnvidia-ml.so.1");
        fs::copy(build(omit), &lib).expect("copy the fake NVML library");
        let node = FakeNode {
            dir,
            lib,
            lines: Mutex::new(Vec::new()),
        };
        node.write();
        node
    }

    /// The library to load.
    pub fn lib_path(&self) -> &Path {
        &self.lib
    }

    /// Set `key` (see `fake_nvml.c` for the keys, e.g. `gpu.3.temp`) to `value` and
    /// write the state file. A key set before keeps its place, so `gpu.*.x` set first
    /// stays under a later `gpu.3.x`.
    pub fn set(&self, key: &str, value: impl ToString) {
        {
            let mut lines = self
                .lines
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match lines.iter_mut().find(|(k, _)| k == key) {
                Some(line) => line.1 = value.to_string(),
                None => lines.push((key.to_owned(), value.to_string())),
            }
        }
        self.write();
    }

    /// Replace the file atomically (the library notices the new inode).
    fn write(&self) {
        let text: String = self
            .lines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(k, v)| format!("{k}={v}\n"))
            .collect();
        let tmp = self.dir.path().join("fake_nvml.state.tmp");
        fs::write(&tmp, text).expect("write the fake NVML state");
        fs::rename(&tmp, self.dir.path().join("fake_nvml.state"))
            .expect("move the fake NVML state into place");
    }
}
