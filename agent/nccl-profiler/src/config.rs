//! What the plugin reads from the environment at each communicator's init: where to put
//! segments, which events to ask NCCL for, and who this process is in the job.
#![deny(unsafe_code)]

use std::path::PathBuf;

use crate::abi::event;

/// Directory for segments unless `WARDEN_SHM_DIR` says otherwise.
pub const DEFAULT_SHM_DIR: &str = "/dev/shm/warden";

/// The default activation mask: collectives, p2p operations and proxy operations (the
/// cheapest level that shows completion; see the crate docs).
pub const DEFAULT_MASK: u64 = event::COLL | event::P2P | event::PROXY_OP;

/// Settings for one init.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// `WARDEN_SHM_DIR`, default [`DEFAULT_SHM_DIR`].
    pub shm_dir: PathBuf,
    /// `WARDEN_NCCL_PROFILER_MASK`, default [`DEFAULT_MASK`].
    pub mask: u64,
    /// A problem with the mask variable, reported through NCCL's logger.
    pub mask_problem: Option<String>,
    /// Global rank, when the launcher said.
    pub global_rank: Option<u32>,
    /// Rank on this node, when the launcher said.
    pub local_rank: Option<u32>,
    /// Ranks in the job, when the launcher said.
    pub world_size: Option<u32>,
    /// Job id (may be empty).
    pub job: String,
}

impl Config {
    /// From the process environment.
    pub fn from_env() -> Config {
        Config::from_lookup(|k| std::env::var(k).ok())
    }

    /// From any variable lookup (tests pass a map).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Config {
        let first_number = |names: &[&str]| {
            names
                .iter()
                .find_map(|n| get(n).and_then(|v| v.trim().parse::<u32>().ok()))
        };
        let (mask, mask_problem) = match get("WARDEN_NCCL_PROFILER_MASK") {
            None => (DEFAULT_MASK, None),
            Some(v) => match parse_mask(&v) {
                Ok(m) => (m, None),
                Err(e) => (
                    DEFAULT_MASK,
                    Some(format!(
                        "WARDEN_NCCL_PROFILER_MASK={v:?}: {e}; using the default"
                    )),
                ),
            },
        };
        Config {
            shm_dir: get("WARDEN_SHM_DIR")
                .filter(|d| !d.is_empty())
                .map_or_else(|| PathBuf::from(DEFAULT_SHM_DIR), PathBuf::from),
            mask,
            mask_problem,
            global_rank: first_number(&["RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"]),
            local_rank: first_number(&[
                "LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_RANK",
                "SLURM_LOCALID",
            ]),
            world_size: first_number(&["WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"]),
            // Plain torchrun sets TORCHELASTIC_RUN_ID=none for every job: no name.
            job: ["WARDEN_JOB", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"]
                .iter()
                .find_map(|n| {
                    get(n).filter(|v| {
                        let v = v.trim();
                        !v.is_empty() && !v.eq_ignore_ascii_case("none")
                    })
                })
                .map(|v| v.trim().to_owned())
                .unwrap_or_default(),
        }
    }
}

/// Event names accepted in `WARDEN_NCCL_PROFILER_MASK`, lower case.
const NAMES: &[(&str, u64)] = &[
    ("group", event::GROUP),
    ("coll", event::COLL),
    ("p2p", event::P2P),
    ("proxyop", event::PROXY_OP),
    ("proxystep", event::PROXY_STEP),
    ("proxyctrl", event::PROXY_CTRL),
    ("kernelch", event::KERNEL_CH),
    ("netplugin", event::NET_PLUGIN),
    ("groupapi", event::GROUP_API),
    ("collapi", event::COLL_API),
    ("p2papi", event::P2P_API),
    ("kernellaunch", event::KERNEL_LAUNCH),
];

/// A mask as a number (`74`, `0x4a`) or event names joined by `,`, `|` or `+`
/// (`coll,p2p,kernelch`; `default` stands for [`DEFAULT_MASK`]).
pub fn parse_mask(s: &str) -> Result<u64, String> {
    let s = s.trim();
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        return u64::from_str_radix(hex, 16).map_err(|e| e.to_string());
    }
    if s.bytes().all(|b| b.is_ascii_digit()) && !s.is_empty() {
        return s.parse::<u64>().map_err(|e| e.to_string());
    }
    let mut mask = 0;
    for word in s.split([',', '|', '+']).map(str::trim) {
        let lower = word.to_ascii_lowercase();
        if lower == "default" {
            mask |= DEFAULT_MASK;
            continue;
        }
        match NAMES.iter().find(|(n, _)| *n == lower) {
            Some((_, bit)) => mask |= bit,
            None => return Err(format!("unknown event name {word:?}")),
        }
    }
    Ok(mask)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> Config {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Config::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn defaults_without_any_variable() {
        let c = config(&[]);
        assert_eq!(c.shm_dir, PathBuf::from(DEFAULT_SHM_DIR));
        assert_eq!(c.mask, DEFAULT_MASK);
        assert_eq!(c.global_rank, None);
        assert_eq!(c.job, "");
    }

    #[test]
    fn launcher_variables_in_order_of_preference() {
        let c = config(&[
            ("SLURM_PROCID", "7"),
            ("OMPI_COMM_WORLD_RANK", "junk"),
            ("SLURM_LOCALID", "3"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_JOB_ID", "4242"),
            ("TORCHELASTIC_RUN_ID", "elastic"),
        ]);
        assert_eq!(c.global_rank, Some(7));
        assert_eq!(c.local_rank, Some(3));
        assert_eq!(c.world_size, Some(16));
        assert_eq!(c.job, "4242");
        let c = config(&[
            ("RANK", "1"),
            ("SLURM_PROCID", "7"),
            ("WARDEN_JOB", "llama"),
        ]);
        assert_eq!(c.global_rank, Some(1));
        assert_eq!(c.job, "llama");
        let c = config(&[("TORCHELASTIC_RUN_ID", "none"), ("RANK", "0")]);
        assert_eq!(c.job, "", "plain torchrun's run id names no job");
    }

    #[test]
    fn masks_as_numbers_or_names_and_bad_ones_fall_back() {
        assert_eq!(parse_mask("0x4a"), Ok(0x4a));
        assert_eq!(parse_mask("6"), Ok(6));
        assert_eq!(
            parse_mask("coll, P2P|kernelch"),
            Ok(event::COLL | event::P2P | event::KERNEL_CH)
        );
        assert_eq!(
            parse_mask("default+kernelch"),
            Ok(DEFAULT_MASK | event::KERNEL_CH)
        );
        assert!(parse_mask("coll,bogus").is_err());
        let c = config(&[("WARDEN_NCCL_PROFILER_MASK", "nonsense")]);
        assert_eq!(c.mask, DEFAULT_MASK);
        assert!(c.mask_problem.is_some());
        let c = config(&[("WARDEN_SHM_DIR", "/tmp/x")]);
        assert_eq!(c.shm_dir, PathBuf::from("/tmp/x"));
    }
}
