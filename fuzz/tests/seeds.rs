//! Every committed seed (`fuzz/corpus/<target>/`, the `regression-*` inputs that once
//! crashed a target among them) through its target's body, in the workspace's own test
//! build: a target that now panics on an input it once passed, or a seed directory
//! without a target, fails here on every run, without nightly or a sanitizer.
//! `scripts/fuzz smoke` and `run` are the fuzzing itself (docs/FUZZING.md).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use warden_fuzz::TARGETS;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// The names of the binaries `fuzz/Cargo.toml` declares (`[[bin]] name = "..."`).
fn declared_binaries() -> BTreeSet<String> {
    let manifest = fs::read_to_string(fuzz_dir().join("Cargo.toml")).expect("read fuzz/Cargo.toml");
    let mut names = BTreeSet::new();
    let mut in_bin = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_bin = line == "[[bin]]";
        } else if in_bin && let Some(v) = line.strip_prefix("name = ") {
            names.insert(v.trim_matches('"').to_owned());
        }
    }
    names
}

#[test]
fn every_binary_and_every_seed_directory_has_its_target() {
    let targets: BTreeSet<String> = TARGETS.iter().map(|(n, _)| (*n).to_owned()).collect();
    assert_eq!(
        declared_binaries(),
        targets,
        "fuzz/Cargo.toml's binaries and warden_fuzz::TARGETS"
    );
    for t in &targets {
        let entry = fs::read_to_string(fuzz_dir().join("fuzz_targets").join(format!("{t}.rs")))
            .expect("each target has its entry");
        assert!(
            entry.contains(&format!("warden_fuzz::{t}::run(")),
            "fuzz_targets/{t}.rs hands its input to warden_fuzz::{t}::run"
        );
    }
    let dirs: BTreeSet<String> = fs::read_dir(fuzz_dir().join("corpus"))
        .expect("read fuzz/corpus")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        dirs, targets,
        "fuzz/corpus holds one seed directory per target"
    );
}

/// The targets one after another, on this one thread: the NCCL plugin's target sets its
/// segment directory in the environment once, before its first input.
#[test]
fn every_target_passes_every_committed_seed() {
    let mut report = Vec::new();
    for (name, run) in TARGETS {
        let dir = fuzz_dir().join("corpus").join(name);
        let mut seeds: Vec<PathBuf> = fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_file())
            .collect();
        seeds.sort();
        assert!(!seeds.is_empty(), "{name} has no seed in {}", dir.display());
        let mut bytes = 0;
        for seed in &seeds {
            let input = fs::read(seed).unwrap_or_else(|e| panic!("read {}: {e}", seed.display()));
            bytes += input.len();
            let outcome = std::panic::catch_unwind(|| run(&input));
            assert!(
                outcome.is_ok(),
                "fuzz target {name} panicked on {} (scripts/fuzz repro {name} {})",
                seed.display(),
                seed.display()
            );
        }
        report.push(format!("{name}: {} seeds, {bytes} bytes", seeds.len()));
    }
    eprintln!("{}", report.join("\n"));
}
