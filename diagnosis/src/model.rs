//! The vocabulary of a diagnosis: failure categories, fault loci, log lines, evidence
//! and the answer itself (its JSON form is the one `warden diagnose --json` prints).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What kind of failure the logs show (the labels of ../shared/DESIGN.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// A collective timed out or hung (NCCL watchdog, gloo timeout).
    NcclTimeoutHang,
    /// InfiniBand / RoCE / socket transport errors.
    NetworkIbError,
    /// An NVIDIA XID, a GPU fallen off the bus, a GPU that fails to initialise.
    GpuHardwareXid,
    /// ECC errors, row-remapping failures, retired pages.
    EccMemoryError,
    /// A CUDA runtime or driver API error (illegal address, launch failure, ...).
    CudaRuntimeError,
    /// The GPU ran out of memory.
    GpuOom,
    /// Loss or gradients became NaN or Inf.
    NanInfLoss,
    /// The host ran out of memory and the kernel killed the process.
    HostOomKilled,
    /// Storage errors: disk full, I/O errors, a failed checkpoint write or read.
    StorageIoError,
    /// A DataLoader worker died or failed.
    DataloaderError,
    /// A plain bug in the training script (Python exception in user code).
    UserCodeError,
    /// A native crash: SIGSEGV, SIGABRT, SIGBUS, core dump.
    SegfaultNativeCrash,
    /// torchrun / rendezvous / launcher / store failures.
    RendezvousLauncherError,
}

impl Category {
    /// Every category, in a stable order.
    pub const ALL: [Category; 13] = [
        Category::NcclTimeoutHang,
        Category::NetworkIbError,
        Category::GpuHardwareXid,
        Category::EccMemoryError,
        Category::CudaRuntimeError,
        Category::GpuOom,
        Category::NanInfLoss,
        Category::HostOomKilled,
        Category::StorageIoError,
        Category::DataloaderError,
        Category::UserCodeError,
        Category::SegfaultNativeCrash,
        Category::RendezvousLauncherError,
    ];

    /// The label used in rules, JSON and reports.
    pub const fn as_str(self) -> &'static str {
        match self {
            Category::NcclTimeoutHang => "nccl_timeout_hang",
            Category::NetworkIbError => "network_ib_error",
            Category::GpuHardwareXid => "gpu_hardware_xid",
            Category::EccMemoryError => "ecc_memory_error",
            Category::CudaRuntimeError => "cuda_runtime_error",
            Category::GpuOom => "gpu_oom",
            Category::NanInfLoss => "nan_inf_loss",
            Category::HostOomKilled => "host_oom_killed",
            Category::StorageIoError => "storage_io_error",
            Category::DataloaderError => "dataloader_error",
            Category::UserCodeError => "user_code_error",
            Category::SegfaultNativeCrash => "segfault_native_crash",
            Category::RendezvousLauncherError => "rendezvous_launcher_error",
        }
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A label that names no category or locus.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?} (expected one of {expected})")]
pub struct UnknownLabel {
    /// "category" or "fault locus".
    pub what: &'static str,
    /// The label given.
    pub value: String,
    /// The labels accepted, comma-separated.
    pub expected: String,
}

impl FromStr for Category {
    type Err = UnknownLabel;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Category::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| UnknownLabel {
                what: "category",
                value: s.to_owned(),
                expected: Category::ALL.map(Category::as_str).join(", "),
            })
    }
}

/// Where the fault lies: who has to fix it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultLocus {
    /// A GPU, its memory, a host component: replace or repair.
    Hardware,
    /// NICs, cables, switches, the fabric.
    Network,
    /// PyTorch, NCCL, CUDA, the driver stack: a software bug or misconfiguration.
    SoftwareFramework,
    /// The training script, its data or its hyperparameters.
    UserCode,
    /// Scheduler, launcher, storage, host resources.
    Infrastructure,
}

impl FaultLocus {
    /// Every locus, in a stable order.
    pub const ALL: [FaultLocus; 5] = [
        FaultLocus::Hardware,
        FaultLocus::Network,
        FaultLocus::SoftwareFramework,
        FaultLocus::UserCode,
        FaultLocus::Infrastructure,
    ];

    /// The label used in rules, JSON and reports.
    pub const fn as_str(self) -> &'static str {
        match self {
            FaultLocus::Hardware => "hardware",
            FaultLocus::Network => "network",
            FaultLocus::SoftwareFramework => "software-framework",
            FaultLocus::UserCode => "user-code",
            FaultLocus::Infrastructure => "infrastructure",
        }
    }
}

impl fmt::Display for FaultLocus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FaultLocus {
    type Err = UnknownLabel;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FaultLocus::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| UnknownLabel {
                what: "fault locus",
                value: s.to_owned(),
                expected: FaultLocus::ALL.map(FaultLocus::as_str).join(", "),
            })
    }
}

/// One input line, with what is known of where it came from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogLine {
    /// Line number in the input (the first line is 1), the id evidence cites.
    pub id: u64,
    /// Node the line came from, when the source says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Global rank of the process that printed it, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// Milliseconds since the Unix epoch, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<i64>,
    /// The text, valid UTF-8 (invalid bytes replaced), without the line terminator.
    pub text: String,
}

/// Who is at fault, as far as the logs say. Empty lists mean "not named".
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Culprit {
    /// Global ranks.
    pub ranks: Vec<u32>,
    /// Hosts / node names (or addresses when that is all the log gives).
    pub nodes: Vec<String>,
    /// GPUs: an index ("3"), a PCI bus id ("0000:41:00.0"), a UUID ("GPU-…") or a
    /// device minor number ("minor 2"), as the log names them.
    pub gpus: Vec<String>,
    /// Local ranks (the rank within a node, as launchers print it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub local_ranks: Vec<u32>,
    /// Operating-system process ids.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pids: Vec<u32>,
    /// The other end of a failed connection: an address ("10.1.2.3", "10.1.2.3:29500")
    /// or a host name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<String>,
    /// Network devices and ports, e.g. "mlx5_3:1".
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
    /// DataLoader worker ids.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workers: Vec<u32>,
    /// The culprit in words, e.g. "rank 7 (gpu-node-26, GPU 3)".
    pub text: String,
}

impl Culprit {
    /// Whether nothing is named.
    pub fn is_empty(&self) -> bool {
        self.ranks.is_empty()
            && self.nodes.is_empty()
            && self.gpus.is_empty()
            && self.local_ranks.is_empty()
            && self.pids.is_empty()
            && self.peers.is_empty()
            && self.devices.is_empty()
            && self.workers.is_empty()
    }
}

/// A line cited as evidence, with why it was chosen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvidenceLine {
    /// The input line's id.
    pub id: u64,
    /// The line (possibly shortened).
    pub text: String,
    /// The rule that matched it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule_id: Option<String>,
    /// Why it was chosen: "rule", "rare-template", "onset", "lagging-rank", ...
    pub reason: String,
    /// Weight in the ranking (higher first); causes outrank symptoms.
    pub score: f64,
}

/// The answer: what failed, where, who, how sure, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Diagnosis {
    /// The failure class; `None` when nothing in the logs says.
    pub category: Option<Category>,
    /// Who has to fix it.
    pub fault_locus: Option<FaultLocus>,
    /// Who is at fault.
    pub culprit: Culprit,
    /// 0..=1.
    pub confidence: f64,
    /// Ids of the rules whose matches support the answer, strongest first.
    pub rule_ids: Vec<String>,
    /// The lines that show it, most telling first.
    pub evidence: Vec<EvidenceLine>,
    /// The answer in words, citing evidence line ids.
    pub explanation: String,
    /// Where the answer came from: `"rules"` or `"llm:<model>"`.
    #[serde(default = "default_source")]
    pub source: String,
    /// The recommended action, in words (a recommendation only: actions come from policy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recommended_action: Option<String>,
}

fn default_source() -> String {
    "rules".to_owned()
}

impl Diagnosis {
    /// The answer when nothing matched.
    pub fn unknown() -> Self {
        Diagnosis {
            category: None,
            fault_locus: None,
            culprit: Culprit::default(),
            confidence: 0.0,
            rule_ids: Vec::new(),
            evidence: Vec::new(),
            explanation: "no rule matched and no template stood out".to_owned(),
            source: default_source(),
            recommended_action: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_round_trip_through_str_and_json() {
        for c in Category::ALL {
            assert_eq!(c.as_str().parse::<Category>(), Ok(c));
            let json = serde_json::to_string(&c).expect("serialize");
            assert_eq!(json, format!("\"{}\"", c.as_str()));
        }
        for l in FaultLocus::ALL {
            assert_eq!(l.as_str().parse::<FaultLocus>(), Ok(l));
            let json = serde_json::to_string(&l).expect("serialize");
            assert_eq!(json, format!("\"{}\"", l.as_str()));
        }
        let err = "gpu_on_fire".parse::<Category>().expect_err("unknown");
        assert!(err.to_string().contains("nccl_timeout_hang"));
    }
}
