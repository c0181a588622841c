//! Warden's node agent: the collectors that turn what a GPU node says about itself into
//! wire-format [`NodeEvent`](warden_model::wire::NodeEvent)s.
//!
//! The kernel log: [`kmsg`] recognises hardware and kernel events in `/dev/kmsg`,
//! dmesg and syslog lines, [`xid`] holds NVIDIA's XID catalog (shipped as
//! `rules/xid.yaml`), and [`dedup`] folds repeats per boot so that a flood of identical
//! lines becomes one event with a count.
//!
//! NVML: [`nvml`] samples every GPU (utilisation, memory, temperature, power, clocks,
//! throttling, ECC, retired pages, remapped rows, PCIe, NVLink), receives XID events
//! from NVML's event set and turns counter jumps between samples into events;
//! [`gpu_metrics`] exports the readings to Prometheus, optionally under dcgm-exporter's
//! names as well.

pub mod dedup;
pub mod gpu_metrics;
pub mod kmsg;
pub mod nvml;
pub mod pci;
pub mod xid;
