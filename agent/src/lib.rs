//! Warden's node agent: the collectors that turn what a GPU node says about itself into
//! wire-format signals, and the runtime that exports and ships them.
//!
//! The kernel log: [`kmsg`] recognises hardware and kernel events in `/dev/kmsg`,
//! dmesg and syslog lines, [`kernel_log`] reads them, [`xid`] holds NVIDIA's XID
//! catalog (shipped as `rules/xid.yaml`), and [`dedup`] folds repeats per boot so that a
//! flood of identical lines becomes one event with a count.
//!
//! NVML: [`nvml`] samples every GPU (utilisation, memory, temperature, power, clocks,
//! throttling, ECC, retired pages, remapped rows, PCIe, NVLink), receives XID events
//! from NVML's event set and turns counter jumps between samples into events;
//! [`gpu_metrics`] exports the readings to Prometheus, optionally under dcgm-exporter's
//! names as well.
//!
//! Training logs: [`logs`] tails files and CRI container logs and extracts training
//! metrics and watchdog reports; [`window`] keeps recent lines for the local [`api`].
//!
//! Inside training processes: [`capture`] receives collective progress, steps and
//! exits from `warden_torch` on a Unix socket and watches those processes' pids;
//! [`nccl`] reads the shared-memory segments of the `warden-nccl-profiler` NCCL plugin
//! (collectives entered and completed per communicator, processes that died in them);
//! [`progress`] keeps both per job and cuts them into each batch with the wire
//! contract's redundancy.
//!
//! The runtime: [`config`] loads and validates the configuration, [`runtime`] wires the
//! [`collectors`] and [`ship`] (batching, bounded buffer, delivery), [`metrics`] holds
//! the agent's own metrics; [`privilege`] opens what needs a capability and then gives
//! up every capability before the first thread starts.

pub mod api;
pub mod capture;
pub mod collectors;
pub mod config;
pub mod dedup;
pub mod gpu_metrics;
pub mod kernel_log;
pub mod kmsg;
pub mod logs;
pub mod logs_collector;
pub mod metrics;
pub mod nccl;
pub mod nvml;
pub mod pci;
pub mod pod_resources;
pub mod privilege;
pub mod progress;
pub mod runtime;
pub mod ship;
pub mod window;
pub use warden_model::xid;
