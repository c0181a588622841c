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

/// Longest node name: a DNS-1123 subdomain.
pub const MAX_NODE_NAME_LEN: usize = 253;

/// FNV-1a, 64 bit: communicator ids made from names (`warden_torch` computes the same
/// over the same names, so every rank of a communicator arrives at the same id).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Check a node name: a DNS-1123 subdomain (lowercase letters, digits, `-` and `.`, each
/// dot-separated part 1 to 63 characters starting and ending with a letter or digit, at
/// most 253 in all). This is what Kubernetes accepts as a node name, and a name that
/// passes can go into a URL, a log line, a store row or a scheduler's command unchanged.
pub fn check_node_name(name: &str) -> Result<(), String> {
    let ok_label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if name.is_empty() || name.len() > MAX_NODE_NAME_LEN || !name.split('.').all(ok_label) {
        return Err(format!(
            "invalid node name {:?}: a DNS-1123 name is lowercase letters, digits, '-' and \
             '.', at most {MAX_NODE_NAME_LEN} characters, each part starting and ending with \
             a letter or digit",
            name.chars().take(80).collect::<String>()
        ));
    }
    Ok(())
}

/// Check a name a client gives that is not a node name (a job, a communicator, an agent
/// or boot id): 1 to `max` bytes with no control characters, so it can go into a log
/// line or a store row as it is.
pub fn check_label(what: &str, value: &str, max: usize) -> Result<(), String> {
    if value.is_empty() || value.len() > max {
        return Err(format!("{what} must be 1 to {max} bytes"));
    }
    if value.chars().any(char::is_control) {
        return Err(format!(
            "{what} {:?} holds control characters",
            value.chars().take(80).collect::<String>()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_are_dns_1123_so_they_cannot_reach_a_url_or_a_log_line_raw() {
        for ok in ["node-1", "a", "gpu-07.rack-3.example", &"a".repeat(63)] {
            assert!(check_node_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "Node-1",
            "-node",
            "node-",
            "a..b",
            "node_1",
            "node 1",
            "nöde",
            "127.0.0.1:18002/x?",
            "node-1\nFORGED line",
            "node\u{1b}[31m",
            &"a".repeat(64),
            &format!("{}.b", "a.".repeat(126)),
        ] {
            assert!(check_node_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn labels_hold_no_control_characters() {
        assert!(check_label("job", "train-7b/run 3", 253).is_ok());
        assert!(check_label("job", "", 253).is_err());
        assert!(check_label("job", "a\nb", 253).is_err());
        assert!(check_label("job", &"x".repeat(254), 253).is_err());
    }
}
