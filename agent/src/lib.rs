//! Warden's node agent: the collectors that turn what a GPU node says about itself into
//! wire-format [`NodeEvent`](warden_model::wire::NodeEvent)s.
//!
//! This first slice covers the kernel log: [`kmsg`] recognises hardware and kernel
//! events in `/dev/kmsg`, dmesg and syslog lines, [`xid`] holds NVIDIA's XID catalog
//! (shipped as `rules/xid.yaml`), and [`dedup`] folds repeats per boot so that a flood
//! of identical lines becomes one event with a count.
//!
//! [`logs`] follows the training logs on the node (plain files and Kubernetes CRI
//! container logs), keeps tracebacks together, attributes lines to job and rank, and
//! reads step, loss, grad norm, throughput and PyTorch watchdog reports out of them.

pub mod dedup;
pub mod kmsg;
pub mod logs;
pub mod pci;
pub mod xid;
