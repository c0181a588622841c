//! Identities: jobs, ranks, nodes, GPUs and communicators.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A training job's name as the scheduler knows it (Slurm job, JobSet, PyTorchJob).
pub type JobId = String;

/// A node's name (Kubernetes node or Slurm node name).
pub type NodeName = String;

/// Global rank of a process within its job.
pub type Rank = u32;

/// A communicator's 64-bit hash (NCCL's `commHash`, or `warden_torch`'s process-group
/// id); a job has many (TP, PP and DP groups).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CommId(pub u64);

impl fmt::Display for CommId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// One GPU: the node it is in and its index there.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GpuRef {
    /// Node the GPU is in.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub node: NodeName,
    /// NVML / CUDA index of the GPU on that node.
    pub index: u32,
}

impl fmt::Display for GpuRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} gpu {}", self.node, self.index)
    }
}
