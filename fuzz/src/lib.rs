//! The fuzz targets' bodies, one module per target: `fuzz_targets/<name>.rs` hands each
//! input from libFuzzer to `<name>::run` (`scripts/fuzz`, nightly, AddressSanitizer),
//! and `tests/seeds.rs` runs every committed seed and past crash input through the same
//! functions in the workspace's test build. docs/FUZZING.md says what each one checks.

pub mod api;
pub mod config;
pub mod cri;
pub mod hostile;
pub mod kmsg;
pub mod log_metrics;
// The plugin is a C ABI: its body calls the entry points as NCCL does.
#[allow(unsafe_code)]
pub mod nccl_profiler;
pub mod policy;
pub mod rules;
pub mod watchdog;
pub mod wire;

/// A target's body: one input, as libFuzzer passes it.
pub type Body = fn(&[u8]);

/// Every target by name, as `fuzz/Cargo.toml` names its binaries, with its body.
pub const TARGETS: &[(&str, Body)] = &[
    ("api", api::run),
    ("config", config::run),
    ("cri", cri::run),
    ("hostile", hostile::run),
    ("kmsg", kmsg::run),
    ("log_metrics", log_metrics::run),
    ("nccl_profiler", nccl_profiler::run),
    ("policy", policy::run),
    ("rules", rules::run),
    ("watchdog", watchdog::run),
    ("wire", wire::run),
];
