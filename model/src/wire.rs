//! The agent-to-controller wire format, version 1.
//!
//! One [`Batch`] per agent per flush (about once a second, or at once when something
//! urgent happens). Binary form: a 9-byte envelope (`WRDN`, version byte, payload length
//! as u32 little-endian) followed by the protobuf encoding of [`Batch`]; the messages
//! below, with their field numbers, are the schema (docs/WIRE.md shows it as a `.proto`).
//! JSON form, for debugging: the same fields by name, with `"version": 1` and enums by
//! name or number.
//!
//! Redundancy is part of the contract: an agent repeats in-flight collectives, rank
//! registrations and critical records (process exits, non-finite metrics, hardware
//! events) in later batches, carries each batch's completed collectives again in the
//! next one, so the loss of one batch loses nothing, and repeats each member's newest
//! completion while it has nothing newer ([`NewestCompletions`]), so the loss of any
//! number loses no member's position; the controller treats every record as idempotent.

use bytes::{Buf, BufMut};
use prost::Message;
use serde::{Deserialize, Serialize};

/// The wire version this crate speaks.
pub const WIRE_VERSION: u8 = 1;
/// The binary envelope's magic bytes.
pub const MAGIC: &[u8; 4] = b"WRDN";
/// Length of the binary envelope (magic, version, payload length).
pub const ENVELOPE_LEN: usize = 9;
/// MIME type of the binary form.
pub const CONTENT_TYPE_BINARY: &str = "application/vnd.warden.batch";
/// MIME type of the JSON form.
pub const CONTENT_TYPE_JSON: &str = "application/json";

/// Why a batch could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Fewer bytes than the envelope or its declared payload length.
    #[error("truncated batch: {0}")]
    Truncated(String),
    /// Not a Warden batch.
    #[error("not a Warden batch: {0}")]
    BadMagic(String),
    /// A version this controller does not speak.
    #[error("unsupported wire version {got} (this controller speaks version {supported})")]
    UnsupportedVersion {
        /// Version the sender used.
        got: u32,
        /// Version this side speaks.
        supported: u32,
    },
    /// Well framed but not valid content.
    #[error("malformed batch: {0}")]
    Malformed(String),
}

impl DecodeError {
    /// A short, bounded label for metrics.
    pub const fn reason(&self) -> &'static str {
        match self {
            DecodeError::Truncated(_) => "truncated",
            DecodeError::BadMagic(_) => "bad_magic",
            DecodeError::UnsupportedVersion { .. } => "unsupported_version",
            DecodeError::Malformed(_) => "malformed",
        }
    }
}

macro_rules! wire_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident = $num:literal => $label:literal),+ $(,)? }
     $ser:ident, $de:ident) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
        #[repr(i32)]
        pub enum $name { $($(#[$vm])* $variant = $num),+ }

        impl $name {
            /// The label used in JSON and in logs.
            pub const fn as_str(self) -> &'static str {
                match self { $($name::$variant => $label),+ }
            }
            /// The variant with this label.
            pub fn from_label(s: &str) -> Option<Self> {
                match s { $($label => Some($name::$variant),)+ _ => None }
            }
            /// The variant with this wire number; unknown numbers map to the default.
            pub fn from_wire(v: i32) -> Self {
                Self::try_from(v).unwrap_or_default()
            }
        }

        fn $ser<S: serde::Serializer>(v: &i32, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_str($name::from_wire(*v).as_str())
        }

        fn $de<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
            #[derive(Deserialize)]
            #[serde(untagged)]
            enum Either { N(i32), S(String) }
            match Either::deserialize(d)? {
                Either::N(n) => Ok(n),
                Either::S(s) => $name::from_label(&s).map(|v| v as i32).ok_or_else(|| {
                    serde::de::Error::custom(format!(concat!("unknown ", stringify!($name), " {:?}"), s))
                }),
            }
        }
    };
}

wire_enum! {
    /// A collective or point-to-point operation.
    CollOp {
        /// Unknown or not reported.
        Unknown = 0 => "unknown",
        AllReduce = 1 => "allreduce",
        AllGather = 2 => "allgather",
        ReduceScatter = 3 => "reducescatter",
        Broadcast = 4 => "broadcast",
        Reduce = 5 => "reduce",
        AllToAll = 6 => "alltoall",
        Send = 7 => "send",
        Recv = 8 => "recv",
        /// Paired send/recv between pipeline stages.
        SendRecv = 9 => "sendrecv",
        Barrier = 10 => "barrier",
    }
    ser_op, de_op
}

wire_enum! {
    /// What kind of node-level event an agent saw.
    NodeEventKind {
        /// Something else worth reporting.
        Other = 0 => "other",
        /// An NVIDIA XID (`code` holds the XID number).
        Xid = 1 => "xid",
        /// ECC error (single- or double-bit, remapping).
        Ecc = 2 => "ecc",
        /// NVLink error.
        Nvlink = 3 => "nvlink",
        /// PCIe error (AER, replays, link down).
        Pcie = 4 => "pcie",
        /// GPU fell off the bus.
        FallenOffBus = 5 => "fallen_off_bus",
        /// Thermal event or throttling.
        Thermal = 6 => "thermal",
        /// InfiniBand / RoCE port or link error.
        Network = 7 => "network",
        /// The kernel's OOM killer ended a process.
        OomKill = 8 => "oom_kill",
        /// Machine-check exception.
        MachineCheck = 9 => "machine_check",
    }
    ser_event_kind, de_event_kind
}

wire_enum! {
    /// Severity an agent assigns to a node event (from the XID catalog and parsers).
    EventSeverity {
        Info = 0 => "info",
        Warning = 1 => "warning",
        /// The device or job is impaired.
        Error = 2 => "error",
        /// The device is lost until reset or replacement.
        Fatal = 3 => "fatal",
    }
    ser_severity, de_severity
}

wire_enum! {
    /// Where a log line came from.
    LogStream {
        Stdout = 0 => "stdout",
        Stderr = 1 => "stderr",
        /// Kernel log.
        Kernel = 2 => "kernel",
    }
    ser_stream, de_stream
}

/// Everything one agent sends in one flush.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, PartialEq, Message, Serialize, Deserialize)]
#[serde(default)]
pub struct Batch {
    /// Wire version (JSON form only; the binary form carries it in the envelope).
    #[prost(uint32, tag = "15")]
    #[cfg_attr(feature = "openapi", schema(required = true, minimum = 1, maximum = 1))]
    pub version: u32,
    /// Node the agent runs on.
    #[prost(string, tag = "1")]
    #[cfg_attr(
        feature = "openapi",
        schema(required = true, min_length = 1, max_length = 253)
    )]
    pub node: String,
    /// The agent's instance id (changes when the agent restarts).
    #[prost(string, tag = "2")]
    pub agent_id: String,
    /// The node's boot id (changes when the node reboots).
    #[prost(string, tag = "3")]
    pub boot_id: String,
    /// Batch counter of this agent instance; gaps mean lost batches.
    #[prost(uint64, tag = "4")]
    pub seq: u64,
    /// Agent clock when the batch was sent, ns since the Unix epoch.
    #[prost(int64, tag = "5")]
    #[cfg_attr(feature = "openapi", schema(required = true, minimum = 1))]
    pub sent_at_ns: i64,
    /// Per-job signals.
    #[prost(message, repeated, tag = "6")]
    pub jobs: Vec<JobSignals>,
    /// GPU telemetry samples.
    #[prost(message, repeated, tag = "7")]
    pub gpus: Vec<GpuSample>,
    /// Hardware and kernel events.
    #[prost(message, repeated, tag = "8")]
    pub events: Vec<NodeEvent>,
    /// Agent self-report.
    #[prost(message, optional, tag = "9")]
    pub heartbeat: Option<Heartbeat>,
}

/// Signals about one job's ranks on this node.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, PartialEq, Message, Serialize, Deserialize)]
#[serde(default)]
pub struct JobSignals {
    /// The job's name.
    #[prost(string, tag = "1")]
    pub job: String,
    /// Rank registrations (repeated periodically).
    #[prost(message, repeated, tag = "2")]
    pub ranks: Vec<RankInfo>,
    /// Communicator registrations (repeated periodically).
    #[prost(message, repeated, tag = "3")]
    pub comms: Vec<CommInfo>,
    /// Collective progress.
    #[prost(message, repeated, tag = "4")]
    pub collectives: Vec<CollectiveEvent>,
    /// Training metrics.
    #[prost(message, repeated, tag = "5")]
    pub metrics: Vec<TrainingMetric>,
    /// Process starts and exits.
    #[prost(message, repeated, tag = "6")]
    pub processes: Vec<ProcessState>,
    /// Training log lines.
    #[prost(message, repeated, tag = "7")]
    pub logs: Vec<LogRecord>,
    /// Network time of each rank's sends per peer (the NCCL plugin's `proxystep` mask).
    #[prost(message, repeated, tag = "8")]
    pub links: Vec<LinkSample>,
}

/// A rank running on this node.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, PartialEq, Message, Serialize, Deserialize)]
#[serde(default)]
pub struct RankInfo {
    /// Global rank.
    #[prost(uint32, tag = "1")]
    pub rank: u32,
    /// Number of ranks in the job.
    #[prost(uint32, tag = "2")]
    pub world_size: u32,
    /// Process id.
    #[prost(uint32, tag = "3")]
    pub pid: u32,
    /// GPU index on the node, when the rank has one.
    #[prost(uint32, optional, tag = "4")]
    pub gpu_index: Option<u32>,
    /// GPU UUID, when known.
    #[prost(string, tag = "5")]
    pub gpu_uuid: String,
}

/// A communicator this rank belongs to.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, PartialEq, Message, Serialize, Deserialize)]
#[serde(default)]
pub struct CommInfo {
    /// Communicator hash.
    #[prost(fixed64, tag = "1")]
    pub comm: u64,
    /// Human name (e.g. `dp-3`), when known.
    #[prost(string, tag = "2")]
    pub name: String,
    /// Number of ranks in the communicator.
    #[prost(uint32, tag = "3")]
    pub size: u32,
    /// Global rank of the member this record is about.
    #[prost(uint32, tag = "4")]
    pub rank: u32,
    /// Its rank within the communicator.
    #[prost(uint32, tag = "5")]
    pub comm_rank: u32,
}

/// One collective of one rank: started (`end_ns == 0`, still in flight when the batch
/// was cut) or completed.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, PartialEq, Message, Serialize, Deserialize)]
#[serde(default)]
pub struct CollectiveEvent {
    /// Communicator hash.
    #[prost(fixed64, tag = "1")]
    pub comm: u64,
    /// Global rank.
    #[prost(uint32, tag = "2")]
    pub rank: u32,
    /// The communicator's collective sequence number (1, 2, ...).
    #[prost(uint64, tag = "3")]
    pub seq: u64,
    /// Operation.
    #[prost(enumeration = "CollOp", tag = "4")]
    #[serde(serialize_with = "ser_op", deserialize_with = "de_op")]
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub op: i32,
    /// Payload bytes.
    #[prost(uint64, tag = "5")]
    pub bytes: u64,
    /// When the rank entered the collective (agent clock, ns).
    #[prost(int64, tag = "6")]
    pub start_ns: i64,
    /// When it completed on this rank (agent clock, ns); 0 while in flight.
    #[prost(int64, tag = "7")]
    pub end_ns: i64,
    /// This rank's own network transfer time for it (proxy events), ns; 0 if unknown.
    #[prost(uint64, tag = "8")]
    pub xfer_ns: u64,
}

/// How long one rank's sends to one peer of a communicator spent on the network, since
/// the rank's communicator began: totals, so that a repeated or lost sample loses
/// nothing (the controller takes differences between samples). From the NCCL plugin's
/// proxy steps (`WARDEN_NCCL_PROFILER_MASK=default+proxystep`): a send step's time from
/// its isend to the network's completion, queueing behind the connection's earlier steps
/// included.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, PartialEq, Message, Serialize, Deserialize)]
#[serde(default)]
pub struct LinkSample {
    /// Communicator hash.
    #[prost(fixed64, tag = "1")]
    pub comm: u64,
    /// Global rank of the sender.
    #[prost(uint32, tag = "2")]
    pub rank: u32,
    /// The sender's rank within the communicator.
    #[prost(uint32, tag = "3")]
    pub comm_rank: u32,
    /// The receiver's rank within the communicator.
    #[prost(uint32, tag = "4")]
    pub peer: u32,
    /// When the agent read the totals (agent clock, ns).
    #[prost(int64, tag = "5")]
    pub at_ns: i64,
    /// Send steps completed.
    #[prost(uint64, tag = "6")]
    pub steps: u64,
    /// Bytes those steps sent.
    #[prost(uint64, tag = "7")]
    pub bytes: u64,
    /// Their time on the network, summed, ns.
    #[prost(uint64, tag = "8")]
    pub busy_ns: u64,
}

/// Largest total a [`LinkSample`] may carry in `steps`, `bytes` or `busy_ns` (2^56): far
/// above any real run's, low enough that differences and ratios stay exact in f64 range.
pub const MAX_LINK_TOTAL: u64 = 1 << 56;

impl CollectiveEvent {
    /// Whether the collective had not completed when the batch was cut.
    pub fn in_flight(&self) -> bool {
        self.end_ns == 0
    }
}

/// Each member's (communicator, rank) newest completed collective, as an agent keeps it
/// to repeat in every batch that holds nothing newer of that member. Completions are
/// otherwise sent in two batches only, so two lost in a row would hide a member's last
/// collective for as long as it stays quiet (a checkpoint, a long evaluation), and a
/// rank that finished it would look stuck before it; with the repeat, the next batch
/// that arrives says where every member stands, and a restarted controller learns it
/// within one batch.
#[derive(Debug, Clone, Default)]
pub struct NewestCompletions {
    by_member: std::collections::BTreeMap<(u64, u32), CollectiveEvent>,
}

impl NewestCompletions {
    /// Most members kept for one job on one node (16 ranks in 4,096 communicators
    /// each); later ones are not repeated.
    pub const LIMIT: usize = 65_536;

    /// A member completed `ev`: it is the member's newest unless a later one is kept.
    pub fn saw(&mut self, ev: &CollectiveEvent) {
        if ev.in_flight() {
            return;
        }
        let key = (ev.comm, ev.rank);
        if let Some(n) = self.by_member.get_mut(&key) {
            if n.seq <= ev.seq {
                n.clone_from(ev);
            }
        } else if self.by_member.len() < Self::LIMIT {
            self.by_member.insert(key, ev.clone());
        }
    }

    /// The rank exited: its members are no longer repeated.
    pub fn forget_rank(&mut self, rank: u32) {
        self.by_member.retain(|&(_, r), _| r != rank);
    }

    /// No member kept.
    pub fn is_empty(&self) -> bool {
        self.by_member.is_empty()
    }

    /// The newest completion of every member with no completion among `sent` (the
    /// batch's other records) and whose rank `alive` accepts, in (communicator, rank)
    /// order: what a batch repeats, ahead of its other records, which are newer.
    pub fn repeats(
        &self,
        sent: &[CollectiveEvent],
        alive: impl Fn(u32) -> bool,
    ) -> Vec<CollectiveEvent> {
        let mut have: Vec<(u64, u32)> = sent
            .iter()
            .filter(|c| !c.in_flight())
            .map(|c| (c.comm, c.rank))
            .collect();
        have.sort_unstable();
        self.by_member
            .iter()
            .filter(|(key, ev)| have.binary_search(key).is_err() && alive(ev.rank))
            .map(|(_, ev)| ev.clone())
            .collect()
    }
}

/// Training progress reported by a rank.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, PartialEq, Message, Serialize, Deserialize)]
#[serde(default)]
pub struct TrainingMetric {
    /// Global rank.
    #[prost(uint32, tag = "1")]
    pub rank: u32,
    /// Optimizer step.
    #[prost(uint64, tag = "2")]
    pub step: u64,
    /// When it was measured (agent clock, ns).
    #[prost(int64, tag = "3")]
    pub at_ns: i64,
    /// This rank's loss, before any reduction.
    #[prost(double, optional, tag = "4")]
    #[serde(with = "nonfinite")]
    pub loss: Option<f64>,
    /// Gradient norm.
    #[prost(double, optional, tag = "5")]
    #[serde(with = "nonfinite")]
    pub grad_norm: Option<f64>,
    /// Throughput.
    #[prost(double, optional, tag = "6")]
    #[serde(with = "nonfinite")]
    pub tokens_per_s: Option<f64>,
    /// With warden_torch's input check: the index, from 0, among this rank's collective
    /// operations since its previous step mark, of the first whose input held a NaN or
    /// infinity before reduction; none when the check is off or every input was finite.
    /// At most `MAX_OP_INDEX` (2^20).
    #[prost(uint32, optional, tag = "7")]
    pub first_nonfinite_op: Option<u32>,
}

/// A rank's process started, stopped, continued or exited.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, PartialEq, Message, Serialize, Deserialize)]
#[serde(default)]
pub struct ProcessState {
    /// Global rank.
    #[prost(uint32, tag = "1")]
    pub rank: u32,
    /// Process id.
    #[prost(uint32, tag = "2")]
    pub pid: u32,
    /// When the state was observed (agent clock, ns).
    #[prost(int64, tag = "3")]
    pub at_ns: i64,
    /// Whether the process is alive.
    #[prost(bool, tag = "4")]
    pub alive: bool,
    /// Exit code, when it exited normally.
    #[prost(int32, optional, tag = "5")]
    pub exit_code: Option<i32>,
    /// Terminating signal, when it was killed.
    #[prost(int32, optional, tag = "6")]
    pub signal: Option<i32>,
    /// Alive but stopped (SIGSTOP, a debugger): it will not make progress by itself.
    #[prost(bool, tag = "7")]
    pub stopped: bool,
    /// Read from the launcher's failure report in a log (torchrun's), not observed:
    /// its time is when the agent read the report.
    #[prost(bool, tag = "8")]
    pub from_log: bool,
}

/// A line of a rank's output.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, PartialEq, Message, Serialize, Deserialize)]
#[serde(default)]
pub struct LogRecord {
    /// Global rank, when attributed.
    #[prost(uint32, optional, tag = "1")]
    pub rank: Option<u32>,
    /// When the line was read (agent clock, ns).
    #[prost(int64, tag = "2")]
    pub at_ns: i64,
    /// Stream.
    #[prost(enumeration = "LogStream", tag = "3")]
    #[serde(serialize_with = "ser_stream", deserialize_with = "de_stream")]
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub stream: i32,
    /// The line (capped by the agent).
    #[prost(string, tag = "4")]
    pub line: String,
}

/// One NVML reading of one GPU.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, PartialEq, Message, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuSample {
    /// GPU index.
    #[prost(uint32, tag = "1")]
    pub index: u32,
    /// GPU UUID.
    #[prost(string, tag = "2")]
    pub uuid: String,
    /// When read (agent clock, ns).
    #[prost(int64, tag = "3")]
    pub at_ns: i64,
    /// SM utilisation, percent.
    #[prost(float, tag = "4")]
    pub util_pct: f32,
    /// Memory used, bytes.
    #[prost(uint64, tag = "5")]
    pub mem_used_bytes: u64,
    /// Temperature, degrees Celsius.
    #[prost(float, tag = "6")]
    pub temp_c: f32,
    /// Power draw, watts.
    #[prost(float, tag = "7")]
    pub power_w: f32,
    /// NVML throttle-reason bit mask.
    #[prost(uint64, tag = "8")]
    pub throttle_reasons: u64,
    /// Uncorrected ECC errors (volatile).
    #[prost(uint64, tag = "9")]
    pub ecc_uncorrected: u64,
}

/// A hardware or kernel event seen on the node.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, PartialEq, Message, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeEvent {
    /// Per-boot sequence number of this event at the agent (deduplication key with
    /// the boot id).
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// When it was seen (agent clock, ns).
    #[prost(int64, tag = "2")]
    pub at_ns: i64,
    /// Kind.
    #[prost(enumeration = "NodeEventKind", tag = "3")]
    #[serde(serialize_with = "ser_event_kind", deserialize_with = "de_event_kind")]
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub kind: i32,
    /// Severity.
    #[prost(enumeration = "EventSeverity", tag = "4")]
    #[serde(serialize_with = "ser_severity", deserialize_with = "de_severity")]
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub severity: i32,
    /// GPU index, when the event names a GPU.
    #[prost(uint32, optional, tag = "5")]
    pub gpu_index: Option<u32>,
    /// PCI bus id as the kernel printed it.
    #[prost(string, tag = "6")]
    pub pci_bus_id: String,
    /// Event code (the XID number for XIDs).
    #[prost(uint32, optional, tag = "7")]
    pub code: Option<u32>,
    /// The raw line or a short description.
    #[prost(string, tag = "8")]
    pub message: String,
    /// How many identical events the agent folded into this one.
    #[prost(uint32, tag = "9")]
    pub count: u32,
}

/// The agent's own state, sent with every batch.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, PartialEq, Message, Serialize, Deserialize)]
#[serde(default)]
pub struct Heartbeat {
    /// Records the agent dropped because its buffer was full, since it started.
    #[prost(uint64, tag = "1")]
    pub dropped_records: u64,
    /// Batches it failed to deliver, since it started.
    #[prost(uint64, tag = "2")]
    pub failed_batches: u64,
    /// Collectors that are down (e.g. `nvml`).
    #[prost(string, repeated, tag = "3")]
    pub collectors_down: Vec<String>,
}

/// Serde adapter: non-finite floats as the strings `"NaN"`, `"inf"`, `"-inf"` (JSON has
/// no literal for them).
mod nonfinite {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            None => s.serialize_none(),
            Some(x) if x.is_nan() => s.serialize_str("NaN"),
            Some(x) if x.is_infinite() && *x > 0.0 => s.serialize_str("inf"),
            Some(x) if x.is_infinite() => s.serialize_str("-inf"),
            Some(x) => s.serialize_f64(*x),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            N(f64),
            S(String),
        }
        Ok(match Option::<Either>::deserialize(d)? {
            None => None,
            Some(Either::N(x)) => Some(x),
            Some(Either::S(s)) => Some(match s.to_ascii_lowercase().as_str() {
                "nan" => f64::NAN,
                "inf" | "+inf" | "infinity" => f64::INFINITY,
                "-inf" | "-infinity" => f64::NEG_INFINITY,
                other => {
                    return Err(serde::de::Error::custom(format!(
                        "expected a number, \"NaN\", \"inf\" or \"-inf\", got {other:?}"
                    )));
                }
            }),
        })
    }
}

/// Binary form of a batch sealed with [`Batch::seal`], stamped with `sent_at_ns`, written
/// to `out` (cleared first). Protobuf merges a field that follows the payload into it, so
/// the stamp is appended rather than re-encoding the batch.
pub fn frame_sealed(payload: &[u8], sent_at_ns: i64, out: &mut Vec<u8>) {
    let stamp = Batch {
        sent_at_ns,
        ..Batch::default()
    };
    let len = payload.len() + stamp.encoded_len();
    out.clear();
    out.reserve(ENVELOPE_LEN + len);
    out.put_slice(MAGIC);
    out.put_u8(WIRE_VERSION);
    out.put_u32_le(len as u32);
    out.put_slice(payload);
    // Encoding into a Vec cannot run out of capacity.
    let _ = stamp.encode(out);
}

/// Largest node or job name accepted.
pub const MAX_NAME_LEN: usize = 253;
/// Largest world size (and communicator size) accepted: four times the largest jobs run
/// today (a few hundred thousand ranks).
pub const MAX_WORLD_SIZE: u32 = 1 << 20;
/// Ranks at or above this are refused: a rank is below its world size.
pub const MAX_RANK: u32 = MAX_WORLD_SIZE;
/// Jobs one batch may carry: one node runs a handful of jobs at once.
pub const MAX_JOBS_PER_BATCH: usize = 64;
/// GPU indices at or above this are refused (the largest nodes have 8 to 16 GPUs).
pub const MAX_GPU_INDEX: u32 = 64;
/// Longest agent id, boot id, communicator name or collector name accepted.
pub const MAX_ID_LEN: usize = 128;
/// Largest `TrainingMetric::first_nonfinite_op` accepted: more collective operations
/// than any rank issues in one step (a step of a large model issues thousands).
pub const MAX_OP_INDEX: u32 = 1 << 20;

impl Batch {
    /// Binary form: envelope + protobuf.
    pub fn encode_binary(&self) -> Vec<u8> {
        let len = self.encoded_len();
        let mut out = Vec::with_capacity(ENVELOPE_LEN + len);
        self.encode_binary_into(&mut out);
        out
    }

    /// Binary form appended to `out` (reuse the buffer on hot paths).
    pub fn encode_binary_into(&self, out: &mut Vec<u8>) {
        let len = self.encoded_len();
        out.reserve(ENVELOPE_LEN + len);
        out.put_slice(MAGIC);
        out.put_u8(WIRE_VERSION);
        out.put_u32_le(len as u32);
        // Encoding into a Vec cannot run out of capacity.
        let _ = self.encode(out);
    }

    /// The protobuf payload without `sent_at_ns`, for a batch built now and sent later:
    /// [`frame_sealed`] stamps the send time when it goes out, so a batch kept through
    /// an outage does not carry a stale clock reading.
    pub fn seal(&self) -> Vec<u8> {
        if self.sent_at_ns == 0 {
            return self.encode_to_vec();
        }
        let mut b = self.clone();
        b.sent_at_ns = 0;
        b.encode_to_vec()
    }

    /// JSON form (pretty enough to read).
    pub fn encode_json(&self) -> Vec<u8> {
        let mut b = self.clone();
        b.version = u32::from(WIRE_VERSION);
        serde_json::to_vec(&b).unwrap_or_default()
    }

    /// Decode the binary form and validate it.
    pub fn decode_binary(mut buf: &[u8]) -> Result<Batch, DecodeError> {
        if buf.len() < ENVELOPE_LEN {
            return Err(DecodeError::Truncated(format!(
                "{} bytes is shorter than the {ENVELOPE_LEN}-byte envelope",
                buf.len()
            )));
        }
        if &buf[..4] != MAGIC {
            return Err(DecodeError::BadMagic(format!(
                "expected magic {:?}, got {:?}",
                String::from_utf8_lossy(MAGIC),
                String::from_utf8_lossy(&buf[..4])
            )));
        }
        buf.advance(4);
        let version = buf.get_u8();
        if version != WIRE_VERSION {
            return Err(DecodeError::UnsupportedVersion {
                got: u32::from(version),
                supported: u32::from(WIRE_VERSION),
            });
        }
        let len = buf.get_u32_le() as usize;
        if buf.len() < len {
            return Err(DecodeError::Truncated(format!(
                "envelope announces {len} payload bytes, got {}",
                buf.len()
            )));
        }
        if buf.len() > len {
            return Err(DecodeError::Malformed(format!(
                "{} bytes after the {len}-byte payload",
                buf.len() - len
            )));
        }
        let batch = Batch::decode(buf).map_err(|e| DecodeError::Malformed(e.to_string()))?;
        batch.validate()?;
        Ok(batch)
    }

    /// Decode the JSON form and validate it.
    pub fn decode_json(buf: &[u8]) -> Result<Batch, DecodeError> {
        #[derive(Deserialize)]
        struct VersionOnly {
            version: Option<u32>,
        }
        let v: VersionOnly = serde_json::from_slice(buf).map_err(json_error)?;
        match v.version {
            Some(v) if v == u32::from(WIRE_VERSION) => {}
            Some(got) => {
                return Err(DecodeError::UnsupportedVersion {
                    got,
                    supported: u32::from(WIRE_VERSION),
                });
            }
            None => {
                return Err(DecodeError::Malformed(
                    "missing field `version` (this controller speaks version 1)".into(),
                ));
            }
        }
        let batch: Batch = serde_json::from_slice(buf).map_err(json_error)?;
        batch.validate()?;
        Ok(batch)
    }

    /// Checks that decoding cannot express: names present and bounded, times sane.
    pub fn validate(&self) -> Result<(), DecodeError> {
        let bad = |what: String| Err(DecodeError::Malformed(what));
        if self.node.is_empty() {
            return bad("field `node` is empty".into());
        }
        if let Err(e) = crate::ids::check_node_name(&self.node) {
            return bad(format!("field `node`: {e}"));
        }
        for (what, v) in [("agent_id", &self.agent_id), ("boot_id", &self.boot_id)] {
            if !v.is_empty()
                && let Err(e) = crate::ids::check_label(what, v, MAX_ID_LEN)
            {
                return bad(format!("field `{what}`: {e}"));
            }
        }
        if self.sent_at_ns <= 0 {
            return bad("field `sent_at_ns` must be a positive Unix time in ns".into());
        }
        if let Some(hb) = &self.heartbeat {
            if hb.collectors_down.len() > 64 {
                return bad("heartbeat.collectors_down: more than 64 collectors".into());
            }
            for c in &hb.collectors_down {
                if let Err(e) = crate::ids::check_label("collector", c, MAX_ID_LEN) {
                    return bad(format!("heartbeat.collectors_down: {e}"));
                }
            }
        }
        for (k, e) in self.events.iter().enumerate() {
            if let Some(g) = e.gpu_index.filter(|&g| g >= MAX_GPU_INDEX) {
                return bad(format!(
                    "events[{k}].gpu_index: {g} is not below {MAX_GPU_INDEX}"
                ));
            }
        }
        if self.jobs.len() > MAX_JOBS_PER_BATCH {
            return bad(format!(
                "{} jobs in one batch; at most {MAX_JOBS_PER_BATCH}",
                self.jobs.len()
            ));
        }
        for (i, j) in self.jobs.iter().enumerate() {
            if let Err(e) = crate::ids::check_label("job", &j.job, MAX_NAME_LEN) {
                return bad(format!("jobs[{i}].job: {e}"));
            }
            for (k, r) in j.ranks.iter().enumerate() {
                if r.world_size > MAX_WORLD_SIZE {
                    return bad(format!(
                        "jobs[{i}].ranks[{k}].world_size: {} is above {MAX_WORLD_SIZE}",
                        r.world_size
                    ));
                }
                if r.world_size > 0 && r.rank >= r.world_size {
                    return bad(format!(
                        "jobs[{i}].ranks[{k}]: rank {} is not below its world size {}",
                        r.rank, r.world_size
                    ));
                }
                if let Some(g) = r.gpu_index.filter(|&g| g >= MAX_GPU_INDEX) {
                    return bad(format!(
                        "jobs[{i}].ranks[{k}].gpu_index: {g} is not below {MAX_GPU_INDEX}"
                    ));
                }
            }
            for (k, c) in j.comms.iter().enumerate() {
                if c.size > MAX_WORLD_SIZE || (c.size > 0 && c.comm_rank >= c.size) {
                    return bad(format!(
                        "jobs[{i}].comms[{k}]: need size <= {MAX_WORLD_SIZE} and comm_rank \
                         below it (size {}, comm_rank {})",
                        c.size, c.comm_rank
                    ));
                }
                if !c.name.is_empty()
                    && let Err(e) = crate::ids::check_label("name", &c.name, MAX_ID_LEN)
                {
                    return bad(format!("jobs[{i}].comms[{k}].{e}"));
                }
            }
            let ranks = [
                ("ranks", j.ranks.iter().map(|r| r.rank).max()),
                ("comms", j.comms.iter().map(|c| c.rank).max()),
                ("collectives", j.collectives.iter().map(|c| c.rank).max()),
                ("metrics", j.metrics.iter().map(|m| m.rank).max()),
                ("processes", j.processes.iter().map(|p| p.rank).max()),
                ("logs", j.logs.iter().filter_map(|l| l.rank).max()),
                ("links", j.links.iter().map(|l| l.rank).max()),
            ];
            for (what, max) in ranks {
                if let Some(r) = max.filter(|&r| r >= MAX_RANK) {
                    return bad(format!(
                        "jobs[{i}].{what}: rank {r} is not below {MAX_RANK}"
                    ));
                }
            }
            for (k, m) in j.metrics.iter().enumerate() {
                if let Some(op) = m.first_nonfinite_op.filter(|&op| op > MAX_OP_INDEX) {
                    return bad(format!(
                        "jobs[{i}].metrics[{k}].first_nonfinite_op: {op} is above {MAX_OP_INDEX}"
                    ));
                }
            }
            for (k, l) in j.links.iter().enumerate() {
                if l.peer >= MAX_WORLD_SIZE
                    || l.comm_rank >= MAX_WORLD_SIZE
                    || l.peer == l.comm_rank
                    || l.at_ns <= 0
                    || l.steps > MAX_LINK_TOTAL
                    || l.bytes > MAX_LINK_TOTAL
                    || l.busy_ns > MAX_LINK_TOTAL
                {
                    return bad(format!(
                        "jobs[{i}].links[{k}]: need comm_rank and peer below {MAX_WORLD_SIZE} and \
                         different, at_ns > 0 and totals at most {MAX_LINK_TOTAL} (comm_rank {}, \
                         peer {}, at {}, steps {}, bytes {}, busy {})",
                        l.comm_rank, l.peer, l.at_ns, l.steps, l.bytes, l.busy_ns
                    ));
                }
            }
            for (k, c) in j.collectives.iter().enumerate() {
                if c.seq == 0 || c.start_ns <= 0 || (c.end_ns != 0 && c.end_ns < c.start_ns) {
                    return bad(format!(
                        "jobs[{i}].collectives[{k}]: need seq >= 1, start_ns > 0 and end_ns \
                         0 or >= start_ns (seq {}, start {}, end {})",
                        c.seq, c.start_ns, c.end_ns
                    ));
                }
            }
        }
        Ok(())
    }
}

fn json_error(e: serde_json::Error) -> DecodeError {
    if e.is_eof() {
        DecodeError::Truncated(e.to_string())
    } else {
        DecodeError::Malformed(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sealed_batch_is_stamped_at_send_time() {
        let b = Batch {
            node: "n1".into(),
            agent_id: "a".into(),
            boot_id: "b".into(),
            seq: 7,
            sent_at_ns: 111,
            heartbeat: Some(Heartbeat::default()),
            ..Batch::default()
        };
        let payload = b.seal();
        let mut out = Vec::new();
        frame_sealed(&payload, 5_000_000_000, &mut out);
        let back = Batch::decode_binary(&out).expect("decodes");
        assert_eq!(back.sent_at_ns, 5_000_000_000);
        assert_eq!(back.seq, 7);
        assert_eq!(
            Batch {
                sent_at_ns: 5_000_000_000,
                ..b
            },
            back
        );
    }

    use super::*;

    fn sample() -> Batch {
        Batch {
            version: 0,
            node: "node-01".into(),
            agent_id: "a1".into(),
            boot_id: "b1".into(),
            seq: 7,
            sent_at_ns: 1_700_000_000_000_000_000,
            jobs: vec![JobSignals {
                job: "llama".into(),
                ranks: vec![RankInfo {
                    rank: 3,
                    world_size: 8,
                    pid: 42,
                    gpu_index: Some(3),
                    gpu_uuid: "GPU-x".into(),
                }],
                comms: vec![CommInfo {
                    comm: u64::MAX - 5,
                    name: "dp-0".into(),
                    size: 8,
                    rank: 3,
                    comm_rank: 3,
                }],
                collectives: vec![CollectiveEvent {
                    comm: u64::MAX - 5,
                    rank: 3,
                    seq: 11,
                    op: CollOp::AllReduce as i32,
                    bytes: 1 << 20,
                    start_ns: 1_700_000_000_000_000_000,
                    end_ns: 0,
                    xfer_ns: 0,
                }],
                metrics: vec![TrainingMetric {
                    rank: 3,
                    step: 10,
                    at_ns: 1_700_000_000_000_000_001,
                    loss: Some(f64::NAN),
                    grad_norm: Some(1.5),
                    tokens_per_s: None,
                    first_nonfinite_op: Some(4),
                }],
                processes: vec![],
                logs: vec![],
                links: vec![],
            }],
            gpus: vec![],
            events: vec![NodeEvent {
                id: 1,
                at_ns: 1_700_000_000_000_000_000,
                kind: NodeEventKind::Xid as i32,
                severity: EventSeverity::Fatal as i32,
                gpu_index: Some(3),
                pci_bus_id: "0000:3b:00".into(),
                code: Some(79),
                message: "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.".into(),
                count: 1,
            }],
            heartbeat: Some(Heartbeat::default()),
        }
    }

    #[test]
    fn binary_round_trip() {
        let b = sample();
        let bytes = b.encode_binary();
        let back = Batch::decode_binary(&bytes).expect("decodes");
        assert_eq!(back.jobs[0].collectives, b.jobs[0].collectives);
        assert!(back.jobs[0].metrics[0].loss.is_some_and(f64::is_nan));
        assert_eq!(back.jobs[0].metrics[0].first_nonfinite_op, Some(4));
        assert_eq!(back.events, b.events);
    }

    #[test]
    fn first_nonfinite_op_is_skipped_by_old_readers_and_none_from_old_writers() {
        use prost::Message as _;
        // TrainingMetric as it was before tag 7.
        #[derive(Clone, PartialEq, prost::Message)]
        struct Before {
            #[prost(uint32, tag = "1")]
            rank: u32,
            #[prost(uint64, tag = "2")]
            step: u64,
            #[prost(double, optional, tag = "4")]
            loss: Option<f64>,
        }
        let now = TrainingMetric {
            rank: 2,
            step: 9,
            loss: Some(f64::INFINITY),
            first_nonfinite_op: Some(17),
            ..TrainingMetric::default()
        };
        let old = Before::decode(now.encode_to_vec().as_slice()).expect("an old reader decodes");
        assert_eq!((old.rank, old.step, old.loss), (2, 9, Some(f64::INFINITY)));
        let back = TrainingMetric::decode(old.encode_to_vec().as_slice()).expect("decodes");
        assert_eq!((back.step, back.first_nonfinite_op), (9, None));
    }

    #[test]
    fn json_round_trip_uses_names_and_nan_strings() {
        let b = sample();
        let json = b.encode_json();
        let text = String::from_utf8(json.clone()).expect("utf8");
        assert!(text.contains("\"op\":\"allreduce\""), "{text}");
        assert!(text.contains("\"loss\":\"NaN\""), "{text}");
        assert!(text.contains("\"first_nonfinite_op\":4"), "{text}");
        let back = Batch::decode_json(&json).expect("decodes");
        assert_eq!(back.jobs[0].collectives, b.jobs[0].collectives);
        assert_eq!(back.jobs[0].metrics[0].first_nonfinite_op, Some(4));
        assert_eq!(back.events[0].kind, NodeEventKind::Xid as i32);
    }

    #[test]
    fn every_truncation_is_rejected_not_panicking() {
        let bytes = sample().encode_binary();
        for cut in 0..bytes.len() {
            let err = Batch::decode_binary(&bytes[..cut]).expect_err("truncated must fail");
            assert!(
                matches!(err, DecodeError::Truncated(_) | DecodeError::BadMagic(_)),
                "cut at {cut}: {err}"
            );
        }
    }

    #[test]
    fn unknown_version_is_named() {
        let mut bytes = sample().encode_binary();
        bytes[4] = 9;
        let err = Batch::decode_binary(&bytes).expect_err("must fail");
        assert_eq!(
            err.to_string(),
            "unsupported wire version 9 (this controller speaks version 1)"
        );
        let err = Batch::decode_json(br#"{"version": 2, "node": "n"}"#).expect_err("must fail");
        assert_eq!(err.reason(), "unsupported_version");
    }

    #[test]
    fn garbage_payload_is_malformed() {
        let mut bytes = vec![];
        bytes.extend_from_slice(MAGIC);
        bytes.push(WIRE_VERSION);
        bytes.extend_from_slice(&3u32.to_le_bytes());
        bytes.extend_from_slice(&[0xff, 0xff, 0xff]);
        assert_eq!(
            Batch::decode_binary(&bytes).expect_err("fails").reason(),
            "malformed"
        );
        assert_eq!(
            Batch::decode_json(b"{\"version\":1,")
                .expect_err("fails")
                .reason(),
            "truncated"
        );
        assert_eq!(
            Batch::decode_json(b"[1,2]").expect_err("fails").reason(),
            "malformed"
        );
    }

    #[test]
    fn link_samples_round_trip_and_bad_ones_are_refused() {
        let good = LinkSample {
            comm: 7,
            rank: 3,
            comm_rank: 1,
            peer: 2,
            at_ns: 1_700_000_000_000_000_000,
            steps: 10,
            bytes: 10 << 20,
            busy_ns: 4_000_000,
        };
        let mut b = sample();
        b.jobs[0].links = vec![good.clone()];
        let back = Batch::decode_binary(&b.encode_binary()).expect("decodes");
        assert_eq!(back.jobs[0].links, vec![good.clone()]);
        for bad in [
            LinkSample {
                peer: 1,
                ..good.clone()
            },
            LinkSample {
                peer: MAX_WORLD_SIZE,
                ..good.clone()
            },
            LinkSample {
                at_ns: 0,
                ..good.clone()
            },
            LinkSample {
                busy_ns: MAX_LINK_TOTAL + 1,
                ..good.clone()
            },
            LinkSample {
                rank: MAX_RANK,
                ..good.clone()
            },
        ] {
            b.jobs[0].links = vec![bad];
            let err = Batch::decode_binary(&b.encode_binary()).expect_err("refused");
            assert!(err.to_string().contains("jobs[0].links"), "{err}");
        }
    }

    #[test]
    fn absurd_ranks_are_refused() {
        let mut b = sample();
        b.jobs[0].metrics[0].rank = u32::MAX;
        let err = Batch::decode_binary(&b.encode_binary()).expect_err("fails");
        assert!(
            err.to_string().contains("jobs[0].metrics: rank 4294967295"),
            "{err}"
        );
    }

    #[test]
    fn validation_names_the_field() {
        let mut b = sample();
        b.jobs[0].collectives[0].seq = 0;
        let err = Batch::decode_binary(&b.encode_binary()).expect_err("fails");
        assert!(err.to_string().contains("jobs[0].collectives[0]"), "{err}");
        let mut b = sample();
        b.node.clear();
        assert!(
            Batch::decode_binary(&b.encode_binary())
                .expect_err("fails")
                .to_string()
                .contains("`node`")
        );
    }

    #[test]
    fn a_client_sent_size_is_bounded_before_anything_is_sized_by_it() {
        let refused = |b: &Batch, want: &str| {
            let err = Batch::decode_binary(&b.encode_binary()).expect_err("refused");
            assert!(err.to_string().contains(want), "{err}");
            let err = Batch::decode_json(&b.encode_json()).expect_err("refused");
            assert!(err.to_string().contains(want), "{err}");
        };
        let mut b = sample();
        b.jobs[0].ranks[0].world_size = u32::MAX;
        refused(&b, "world_size: 4294967295 is above");
        let mut b = sample();
        b.jobs[0].ranks[0].rank = 4_194_303;
        b.jobs[0].ranks[0].world_size = 0;
        refused(&b, "rank 4194303 is not below");
        let mut b = sample();
        b.jobs[0].ranks[0].rank = 9;
        refused(&b, "rank 9 is not below its world size 8");
        let mut b = sample();
        b.jobs[0].comms[0].size = u32::MAX;
        refused(&b, "comms[0]");
        let mut b = sample();
        b.jobs = (0..=MAX_JOBS_PER_BATCH)
            .map(|i| JobSignals {
                job: format!("j{i}"),
                ..JobSignals::default()
            })
            .collect();
        refused(&b, "65 jobs in one batch");
        let mut b = sample();
        b.jobs[0].ranks[0].gpu_index = Some(1 << 30);
        refused(&b, "gpu_index");
        let mut b = sample();
        b.jobs[0].metrics[0].first_nonfinite_op = Some(MAX_OP_INDEX + 1);
        refused(&b, "metrics[0].first_nonfinite_op: 1048577 is above");
    }

    #[test]
    fn a_node_name_that_could_reach_a_url_or_forge_a_log_line_is_refused() {
        for name in ["127.0.0.1:18002/x?", "node-1\nFORGED", "Node-1", "node_1"] {
            let mut b = sample();
            b.node = name.into();
            let err = Batch::decode_binary(&b.encode_binary()).expect_err("refused");
            assert!(err.to_string().contains("DNS-1123"), "{name:?}: {err}");
        }
        let mut b = sample();
        b.jobs[0].job = "job\nFORGED".into();
        let err = Batch::decode_binary(&b.encode_binary()).expect_err("refused");
        assert!(err.to_string().contains("control characters"), "{err}");
    }
}
