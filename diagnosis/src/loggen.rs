//! A deterministic generator of realistic multi-rank training logs, for benchmarks and
//! end-to-end tests of diagnosis: Megatron/DeepSpeed iteration and timer lines, NCCL INFO
//! bursts at communicator set-up, torch warnings, dataloader chatter, checkpoints, an
//! occasional harmless traceback, and at the end one injected failure: a CUDA OOM that a
//! retry wrapper survives on one rank, then a GPU falling off the bus (XID 79) on the
//! culprit's node, NCCL WARN NET/IB on its ring neighbours, and ProcessGroupNCCL
//! watchdog timeouts on every rank, the culprit's one collective behind the others.
//!
//! Every line is `<ISO-8601 UTC> <host> <source>: <message>`, where `<source>` is
//! `[rankN]` for a training process, `kernel` for the kernel log and `torchrun` for the
//! launcher. The same seed and config give the same bytes on every platform (our own
//! SplitMix64, no wall clock).

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::io::{self, Write as _};

/// What to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct GenConfig {
    /// Seed of the pseudo-random stream.
    pub seed: u64,
    /// Nodes in the job.
    pub nodes: u32,
    /// GPUs (ranks) per node.
    pub gpus_per_node: u32,
    /// Stop after about this many bytes (the failure tail comes on top, a few KiB per
    /// hundred ranks).
    pub target_bytes: u64,
    /// Stop after this many lines of normal training, whichever comes first.
    pub max_lines: u64,
    /// Time of the first line, milliseconds since the Unix epoch.
    pub start_ms: i64,
    /// Whether to end with the injected failure.
    pub inject_failure: bool,
}

impl Default for GenConfig {
    fn default() -> Self {
        GenConfig {
            seed: 0x5eed_2024,
            nodes: 16,
            gpus_per_node: 8,
            target_bytes: 1 << 30,
            max_lines: u64::MAX,
            // 2024-05-14T03:00:00Z
            start_ms: 1_715_655_600_000,
            inject_failure: true,
        }
    }
}

/// What was generated, including the ground truth of the injected failure.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenSummary {
    /// Lines written.
    pub lines: u64,
    /// Bytes written, line terminators included.
    pub bytes: u64,
    /// Ranks in the job.
    pub world_size: u32,
    /// The rank whose GPU failed.
    pub culprit_rank: Option<u32>,
    /// Its node's host name.
    pub culprit_node: Option<String>,
    /// Id (0-based line number) of the first line of the failure (the XID).
    pub onset_line: Option<u64>,
    /// Time of that line.
    pub onset_ms: Option<i64>,
    /// Ids of the injected fault lines (OOM, XID, NCCL WARN, watchdog timeouts).
    pub fault_lines: Vec<u64>,
}

/// One line of the generated log, with what its prefix says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenLine {
    /// Line id (0-based).
    pub id: u64,
    /// Rank, for training-process lines.
    pub rank: Option<u32>,
    /// Index of the node (host `gpu-node-NNN`).
    pub node: u32,
    /// Time, milliseconds since the Unix epoch.
    pub at_ms: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Rank(u32),
    Kernel,
    Launcher,
}

#[derive(Debug)]
struct Pending {
    source: Source,
    node: u32,
    at_ms: i64,
    fault: bool,
    msg: String,
}

/// SplitMix64: tiny, fast and the same everywhere.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Startup,
    Training,
    Failure,
    Done,
}

/// The generator: call [`LogGen::next_line`] until it returns `None`.
#[derive(Debug)]
pub struct LogGen {
    cfg: GenConfig,
    rng: Rng,
    world: u32,
    phase: Phase,
    queue: VecDeque<Pending>,
    now_ms: i64,
    iteration: u64,
    seq: u64,
    loss: f64,
    pids: Vec<u32>,
    summary: GenSummary,
}

const ITERATION_MS: i64 = 1_180;
const TRAIN_ITERS: u64 = 500_000;
const OPS: [&str; 4] = [
    "ALLREDUCE",
    "_ALLGATHER_BASE",
    "_REDUCE_SCATTER_BASE",
    "BROADCAST",
];

impl LogGen {
    /// A generator for `cfg` (nodes and GPUs per node are taken as at least 1).
    pub fn new(cfg: GenConfig) -> Self {
        let nodes = cfg.nodes.max(1);
        let gpus = cfg.gpus_per_node.max(1);
        let world = nodes * gpus;
        let mut rng = Rng(cfg.seed);
        let pids = (0..world)
            .map(|_| 20_000 + rng.below(40_000) as u32)
            .collect();
        let summary = GenSummary {
            world_size: world,
            ..GenSummary::default()
        };
        LogGen {
            cfg: GenConfig {
                nodes,
                gpus_per_node: gpus,
                ..cfg
            },
            now_ms: cfg.start_ms,
            rng,
            world,
            phase: Phase::Startup,
            queue: VecDeque::new(),
            iteration: 0,
            seq: 0,
            loss: 10.8,
            pids,
            summary,
        }
    }

    /// What has been generated so far (complete once `next_line` returned `None`).
    pub fn summary(&self) -> &GenSummary {
        &self.summary
    }

    /// Writes the next line (without terminator) into `out`, replacing its contents.
    pub fn next_line(&mut self, out: &mut String) -> Option<GenLine> {
        loop {
            if let Some(p) = self.queue.pop_front() {
                out.clear();
                format_ts(out, p.at_ms);
                let _ = write!(out, " {}", host(p.node));
                match p.source {
                    Source::Rank(r) => {
                        let _ = write!(out, " [rank{r}]:");
                    }
                    Source::Kernel => out.push_str(" kernel:"),
                    Source::Launcher => out.push_str(" torchrun:"),
                }
                out.push_str(&p.msg);
                let id = self.summary.lines;
                self.summary.lines += 1;
                self.summary.bytes += out.len() as u64 + 1;
                if p.fault {
                    self.summary.fault_lines.push(id);
                    if self.summary.onset_line.is_none() && p.source == Source::Kernel {
                        self.summary.onset_line = Some(id);
                        self.summary.onset_ms = Some(p.at_ms);
                    }
                }
                return Some(GenLine {
                    id,
                    rank: match p.source {
                        Source::Rank(r) => Some(r),
                        _ => None,
                    },
                    node: p.node,
                    at_ms: p.at_ms,
                });
            }
            match self.phase {
                Phase::Startup => {
                    self.startup();
                    self.phase = Phase::Training;
                }
                Phase::Training => {
                    let reserve = 300 * u64::from(self.world);
                    let full = self.summary.bytes + reserve >= self.cfg.target_bytes
                        || self.summary.lines >= self.cfg.max_lines;
                    if full {
                        self.phase = if self.cfg.inject_failure {
                            Phase::Failure
                        } else {
                            Phase::Done
                        };
                    } else {
                        self.iterate();
                    }
                }
                Phase::Failure => {
                    self.failure();
                    self.phase = Phase::Done;
                }
                Phase::Done => return None,
            }
        }
    }

    fn node_of(&self, rank: u32) -> u32 {
        rank / self.cfg.gpus_per_node
    }

    fn push(&mut self, source: Source, at_ms: i64, msg: String) {
        let node = match source {
            Source::Rank(r) => self.node_of(r),
            _ => 0,
        };
        self.queue.push_back(Pending {
            source,
            node,
            at_ms,
            fault: false,
            msg,
        });
    }

    fn push_fault(&mut self, source: Source, node: u32, at_ms: i64, msg: String) {
        self.queue.push_back(Pending {
            source,
            node,
            at_ms,
            fault: true,
            msg,
        });
    }

    /// `host:pid:tid [dev]` as NCCL prefixes its lines.
    fn nccl_prefix(&mut self, rank: u32) -> String {
        let pid = self.pids[rank as usize];
        let tid = pid + 1 + self.rng.below(400) as u32;
        let dev = rank % self.cfg.gpus_per_node;
        format!(" {}:{pid}:{tid} [{dev}]", host(self.node_of(rank)))
    }

    fn startup(&mut self) {
        let t = self.now_ms;
        let world = self.world;
        for node in 0..self.cfg.nodes {
            self.queue.push_back(Pending {
                source: Source::Launcher,
                node,
                at_ms: t,
                fault: false,
                msg: format!(
                    " Starting elastic_operator with launch configs: entrypoint: pretrain_gpt.py, min_nodes: {0}, max_nodes: {0}, nproc_per_node: {1}, run_id: llama70b-{2:x}, rdzv_backend: c10d, rdzv_endpoint: {3}:29500",
                    self.cfg.nodes,
                    self.cfg.gpus_per_node,
                    self.cfg.seed,
                    ip(0)
                ),
            });
        }
        let args = [
            ("tensor_model_parallel_size", "8".to_owned()),
            ("pipeline_model_parallel_size", "2".to_owned()),
            ("micro_batch_size", "1".to_owned()),
            ("global_batch_size", "2048".to_owned()),
            ("seq_length", "4096".to_owned()),
            ("lr", "0.00015".to_owned()),
            ("bf16", "True".to_owned()),
            (
                "data_path",
                "['/data/tokens/pile_text_document']".to_owned(),
            ),
            ("save", "/ckpt/llama-70b".to_owned()),
            ("world_size", world.to_string()),
        ];
        for (k, v) in args {
            let dots = ".".repeat(48usize.saturating_sub(k.len()));
            self.push(Source::Rank(0), t + 40, format!("   {k} {dots} {v}"));
        }
        self.comm_init(t + 2_000, 0);
        self.now_ms = t + 30_000;
    }

    /// The NCCL INFO burst of a communicator being set up on every rank.
    fn comm_init(&mut self, t: i64, comm: u64) {
        let world = self.world;
        let comm_id = self.rng.next();
        for rank in 0..world {
            let p = self.nccl_prefix(rank);
            let at = t + i64::from(rank % 50);
            let dev = rank % self.cfg.gpus_per_node;
            let node = self.node_of(rank);
            if comm == 0 {
                self.push(
                    Source::Rank(rank),
                    at,
                    format!("{p} NCCL INFO NCCL version 2.21.5+cuda12.4"),
                );
                self.push(
                    Source::Rank(rank),
                    at,
                    format!(
                        "{p} NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB [3]mlx5_3:1/IB ; OOB eth0:{}<0>",
                        ip(node)
                    ),
                );
                self.push(
                    Source::Rank(rank),
                    at,
                    format!("{p} NCCL INFO Using network IB"),
                );
            }
            let comm_ptr = 0x55d0_0000_0000u64 + self.rng.below(1 << 32);
            self.push(
                Source::Rank(rank),
                at + 1,
                format!(
                    "{p} NCCL INFO ncclCommInitRank comm {comm_ptr:#x} rank {rank} nranks {world} cudaDev {dev} nvmlDev {dev} busId {:x}000 commId {comm_id:#x} - Init START",
                    bus(dev)
                ),
            );
            for ch in 0..4 {
                let next = (rank + 1) % world;
                let via = if self.node_of(next) == node {
                    "P2P/IPC/read"
                } else {
                    "NET/IB/0/GDRDMA"
                };
                self.push(
                    Source::Rank(rank),
                    at + 2,
                    format!(
                        "{p} NCCL INFO Channel {ch:02}/0 : {rank}[{dev}] -> {next}[{}] via {via}",
                        next % self.cfg.gpus_per_node
                    ),
                );
            }
            self.push(
                Source::Rank(rank),
                at + 3,
                format!("{p} NCCL INFO Connected all rings"),
            );
            self.push(
                Source::Rank(rank),
                at + 3,
                format!("{p} NCCL INFO Connected all trees"),
            );
            let used = 200_000_000 + self.rng.below(100_000_000);
            let core = self.rng.below(96);
            self.push(
                Source::Rank(rank),
                at + 4,
                format!(
                    "{p} NCCL INFO ncclCommInitRank comm {comm_ptr:#x} rank {rank} nranks {world} cudaDev {dev} nvmlDev {dev} busId {:x}000 commId {comm_id:#x} localSize {} used {used} bytes on core {core} - Init COMPLETE",
                    bus(dev),
                    self.cfg.gpus_per_node,
                ),
            );
        }
    }

    /// One training iteration's lines.
    fn iterate(&mut self) {
        self.iteration += 1;
        let it = self.iteration;
        self.seq += 3;
        let t0 = self.now_ms;
        let step_ms = ITERATION_MS + self.rng.below(60) as i64 - 30;
        self.now_ms += step_ms;
        self.loss = (self.loss * 0.99995 + 1.6 * 0.00005).max(1.6);
        let world = self.world;
        let last = world - 1;

        for rank in 0..world {
            let at = t0 + step_ms * i64::from(rank) / i64::from(world) + self.rng.below(5) as i64;
            if self.rng.chance(0.25) {
                let worker = self.rng.below(8);
                let shard = self.rng.below(100_000);
                let secs = 0.2 + self.rng.unit() * 2.0;
                let n = 1 << (15 + self.rng.below(5));
                self.push(
                    Source::Rank(rank),
                    at,
                    format!(" data_loader worker {worker}: prefetched shard /data/tokens/shard_{shard:05}.bin ({n} samples) in {secs:.2}s"),
                );
            }
            if it.is_multiple_of(50) {
                let alloc = 30_000.0 + self.rng.unit() * 8_000.0;
                self.push(
                    Source::Rank(rank),
                    at,
                    format!(
                        " [Rank {rank}] (after {it} iterations) memory (MB) | allocated: {alloc:.1} | max allocated: {:.1} | reserved: {:.1} | max reserved: {:.1}",
                        alloc * 1.8,
                        alloc * 2.1,
                        alloc * 2.1
                    ),
                );
            }
            if self.rng.chance(0.0015) {
                self.push(
                    Source::Rank(rank),
                    at,
                    " /usr/local/lib/python3.10/dist-packages/torch/utils/checkpoint.py:61: UserWarning: None of the inputs have requires_grad=True. Gradients will be None".to_owned(),
                );
                self.push(Source::Rank(rank), at, "   warnings.warn(".to_owned());
            }
            if self.rng.chance(0.001) {
                let line = 1_800 + self.rng.below(200);
                self.push(
                    Source::Rank(rank),
                    at,
                    format!("[W{} ProcessGroupNCCL.cpp:{line}] Warning: TORCH_NCCL_AVOID_RECORD_STREAMS=1 has no effect for point-to-point collectives. (function operator())", glog_time(at)),
                );
            }
        }

        let t = t0 + step_ms - 5;
        let lr = 1.5e-4 * (1.0 - it as f64 / TRAIN_ITERS as f64).max(0.1);
        let elapsed = step_ms as f64 + self.rng.unit();
        let grad = 0.6 + self.rng.unit() * 0.8;
        let loss = self.loss + (self.rng.unit() - 0.5) * 0.05;
        self.push(
            Source::Rank(last),
            t,
            format!(
                " [{}] iteration {it:>8}/{TRAIN_ITERS:>8} | consumed samples: {:>12} | elapsed time per iteration (ms): {elapsed:.1} | learning rate: {lr:.6E} | global batch size:  2048 | lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: {grad:.3} | number of skipped iterations:   0 | number of nan iterations:   0 |",
                wall_time(t),
                it * 2048
            ),
        );
        self.push(
            Source::Rank(0),
            t,
            format!(" [INFO] [logging.py:96:log_dist] [Rank 0] step={it}, skipped=0, lr=[{lr:.7}], mom=[(0.9, 0.95)]"),
        );
        if it.is_multiple_of(10) {
            let fb = elapsed - 40.0;
            self.push(
                Source::Rank(last),
                t,
                " (min, max) time across ranks (ms):".to_owned(),
            );
            for (name, base) in [
                ("forward-backward", fb),
                ("forward-compute", fb * 0.31),
                ("backward-compute", fb * 0.62),
                ("optimizer", 31.0),
            ] {
                let dots = ".".repeat(40usize.saturating_sub(name.len()));
                let lo = base * (0.98 + self.rng.unit() * 0.01);
                self.push(
                    Source::Rank(last),
                    t,
                    format!("     {name} {dots}: ({lo:.2}, {:.2})", base * 1.01),
                );
            }
            let avg = 1735.0 + self.rng.unit() * 10.0;
            let cur = 1700.0 + self.rng.unit() * 60.0;
            let mem = 30.0 + self.rng.unit() * 8.0;
            let max_mem = 61.0 + self.rng.unit();
            self.push(
                Source::Rank(0),
                t,
                format!(
                    " [INFO] [timer.py:260:stop] epoch=0/micro_step={}/global_step={it}, RunningAvgSamplesPerSec={avg:.1}, CurrSamplesPerSec={cur:.1}, MemAllocated={mem:.1}GB, MaxMemAllocated={max_mem:.1}GB",
                    it * 8,
                ),
            );
        }
        if it.is_multiple_of(1000) {
            self.push(
                Source::Rank(0),
                t,
                format!(" saving checkpoint at iteration {it:>8} to /ckpt/llama-70b/iter_{it:07}"),
            );
            for rank in 0..world {
                let tp = rank % 8 + 1;
                let pp = (rank / 8) % 2 + 1;
                self.push(
                    Source::Rank(rank),
                    t + 9_000,
                    format!("   successfully saved checkpoint from iteration {it:>8} to /ckpt/llama-70b/iter_{it:07} [ t {tp}/8, p {pp}/2 ]"),
                );
            }
            self.now_ms += 9_000;
        }
        if it.is_multiple_of(5000) {
            // A new communicator (e.g. an eval group) every few thousand iterations.
            let t = self.now_ms;
            self.comm_init(t, it);
        }
        if self.rng.chance(0.002) {
            self.harmless_traceback(t);
        }
    }

    fn harmless_traceback(&mut self, t: i64) {
        let r = Source::Rank(0);
        self.push(
            r,
            t,
            " wandb: Network error (ReadTimeout), entering retry loop.".to_owned(),
        );
        for line in [
            " Traceback (most recent call last):",
            "   File \"/usr/local/lib/python3.10/dist-packages/urllib3/connectionpool.py\", line 467, in _make_request",
            "     six.raise_from(e, None)",
            "   File \"<string>\", line 3, in raise_from",
            "   File \"/usr/local/lib/python3.10/dist-packages/urllib3/connectionpool.py\", line 462, in _make_request",
            "     httplib_response = conn.getresponse()",
            " socket.timeout: The read operation timed out",
        ] {
            self.push(r, t, line.to_owned());
        }
    }

    /// The injected failure, in the order the logs would show it.
    fn failure(&mut self) {
        let world = self.world;
        let gpus = self.cfg.gpus_per_node;
        let culprit = (self.rng.below(u64::from(world)) as u32).max(1);
        let node = self.node_of(culprit);
        self.summary.culprit_rank = Some(culprit);
        self.summary.culprit_node = Some(host(node));
        let mut t = self.now_ms;

        // A CUDA OOM on another rank, caught by a retry wrapper half a minute earlier.
        let oom_rank = (culprit + world / 2) % world;
        let oom_dev = oom_rank % gpus;
        for msg in [
            " WARNING: caught OutOfMemoryError in train_step; retrying with micro batch split 2"
                .to_owned(),
            " Traceback (most recent call last):".to_owned(),
            "   File \"/workspace/megatron/training.py\", line 744, in train_step".to_owned(),
            "     losses_reduced = forward_backward_func(".to_owned(),
            format!(
                " torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.50 GiB. GPU {oom_dev} has a total capacity of 79.11 GiB of which 1.27 GiB is free. Including non-PyTorch memory, this process has 77.83 GiB memory in use. Of the allocated memory 71.20 GiB is allocated by PyTorch, and 5.12 GiB is reserved by PyTorch but unallocated."
            ),
        ] {
            self.push_fault(Source::Rank(oom_rank), self.node_of(oom_rank), t, msg);
        }

        // The GPU falls off the bus.
        let dev = culprit % gpus;
        t += 30_700;
        self.push_fault(
            Source::Kernel,
            node,
            t,
            format!(
                " NVRM: Xid (PCI:0000:{:x}:00): 79, pid={}, name=python, GPU has fallen off the bus.",
                bus(dev),
                self.pids[culprit as usize]
            ),
        );
        self.push_fault(
            Source::Kernel,
            node,
            t,
            format!(
                " NVRM: GPU 0000:{:x}:00.0: GPU has fallen off the bus.",
                bus(dev)
            ),
        );
        // Its ring neighbours' transport errors.
        for peer in [(culprit + world - 1) % world, (culprit + 1) % world] {
            if peer == culprit {
                continue;
            }
            let p = self.nccl_prefix(peer);
            let port = 40_000 + self.rng.below(20_000);
            let local = ip(self.node_of(peer));
            self.push_fault(
                Source::Rank(peer),
                self.node_of(peer),
                t + 2_500,
                format!(
                    "{p} NCCL WARN NET/IB : Got completion from peer {}<{port}> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:{local} remoteGid ::ffff:{} hca mlx5_2",
                    ip(node),
                    ip(node)
                ),
            );
        }
        // Ten minutes later, every watchdog fires; the culprit's is one collective behind.
        let seq = self.seq + 1;
        t += 600_000;
        for rank in 0..world {
            let at = t + i64::from(rank % 97);
            let (work, completed) = if rank == culprit {
                (seq - 1, seq - 2)
            } else {
                (seq, seq - 1)
            };
            let ran = 600_000 + self.rng.below(90);
            let g = glog_time(at);
            let line_no = 632;
            let numel = 262_144_000;
            self.push_fault(
                Source::Rank(rank),
                self.node_of(rank),
                at,
                format!(
                    "[E{g} ProcessGroupNCCL.cpp:{line_no}] [Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={work}, OpType={}, NumelIn={numel}, NumelOut={numel}, Timeout(ms)=600000) ran for {ran} milliseconds before timing out.",
                    OPS[0]
                ),
            );
            self.push_fault(
                Source::Rank(rank),
                self.node_of(rank),
                at,
                format!(
                    "[E{g} ProcessGroupNCCL.cpp:1709] [PG 0 (default_pg) Rank {rank}] Timeout at NCCL work: {work}, last enqueued NCCL work: {work}, last completed NCCL work: {completed}."
                ),
            );
            self.push(
                Source::Rank(rank),
                at,
                format!("[E{g} ProcessGroupNCCL.cpp:621] [Rank {rank}] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data."),
            );
            self.push(
                Source::Rank(rank),
                at,
                format!("[E{g} ProcessGroupNCCL.cpp:627] [Rank {rank}] To avoid data inconsistency, we are taking the entire process down."),
            );
        }
        t += 5_000;
        let pid = self.pids[culprit as usize];
        for msg in [
            format!(
                " E0514 failed (exitcode: -6) local_rank: {dev} (pid: {pid}) of binary: /usr/bin/python3"
            ),
            " torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ".to_owned(),
            format!("   rank      : {culprit} (local_rank: {dev})"),
            format!("   exitcode  : -6 (pid: {pid})"),
            format!("   traceback : Signal 6 (SIGABRT) received by PID {pid}"),
        ] {
            self.queue.push_back(Pending {
                source: Source::Launcher,
                node,
                at_ms: t,
                fault: false,
                msg,
            });
        }
    }
}

/// Writes a whole log to `out`, one line per `\n`; returns the summary.
pub fn write_log<W: io::Write>(cfg: &GenConfig, out: W) -> io::Result<GenSummary> {
    let mut out = io::BufWriter::with_capacity(1 << 20, out);
    let mut generator = LogGen::new(cfg.clone());
    let mut line = String::new();
    while generator.next_line(&mut line).is_some() {
        out.write_all(line.as_bytes())?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(generator.summary().clone())
}

fn host(node: u32) -> String {
    format!("gpu-node-{node:03}")
}

fn ip(node: u32) -> String {
    format!("10.0.{}.{}", node / 200, node % 200 + 10)
}

/// PCI bus number of a GPU index, as on a typical 8-GPU server.
fn bus(dev: u32) -> u32 {
    [0x1b, 0x29, 0x3b, 0x4d, 0x9b, 0xa9, 0xbb, 0xcb][(dev % 8) as usize]
}

/// Civil date of a day count since 1970-01-01 (proleptic Gregorian).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn split_ms(ms: i64) -> ((i64, u32, u32), i64, i64, i64, i64) {
    let days = ms.div_euclid(86_400_000);
    let rem = ms.rem_euclid(86_400_000);
    (
        civil(days),
        rem / 3_600_000,
        rem / 60_000 % 60,
        rem / 1_000 % 60,
        rem % 1_000,
    )
}

/// `2024-05-14T03:12:45.123Z`
fn format_ts(out: &mut String, ms: i64) {
    let ((y, mo, d), h, mi, s, milli) = split_ms(ms);
    let _ = write!(
        out,
        "{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{milli:03}Z"
    );
}

/// `2024-05-14 03:12:45` as Megatron prints it.
fn wall_time(ms: i64) -> String {
    let ((y, mo, d), h, mi, s, _) = split_ms(ms);
    format!("{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02}")
}

/// `0514 03:12:45.123000` as glog prints it after the level letter.
fn glog_time(ms: i64) -> String {
    let ((_, mo, d), h, mi, s, milli) = split_ms(ms);
    format!(
        "{mo:02}{d:02} {h:02}:{mi:02}:{s:02}.{milli:03}{:03}",
        (ms * 7) % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> GenConfig {
        GenConfig {
            nodes: 2,
            gpus_per_node: 4,
            target_bytes: 400_000,
            ..GenConfig::default()
        }
    }

    #[test]
    fn same_seed_same_bytes_other_seed_other_bytes() {
        let mut a = Vec::new();
        let mut b = Vec::new();
        let mut c = Vec::new();
        write_log(&small(), &mut a).expect("write to memory");
        write_log(&small(), &mut b).expect("write to memory");
        write_log(&GenConfig { seed: 7, ..small() }, &mut c).expect("write to memory");
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn size_lines_and_ground_truth_are_reported() {
        let mut buf = Vec::new();
        let s = write_log(&small(), &mut buf).expect("write to memory");
        assert_eq!(s.bytes, buf.len() as u64);
        let text = String::from_utf8(buf).expect("generated text is UTF-8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(s.lines, lines.len() as u64);
        assert!(s.bytes >= 400_000 - 300 * 8, "{} bytes", s.bytes);
        assert!(s.bytes < 400_000 + 20_000, "{} bytes", s.bytes);
        let culprit = s.culprit_rank.expect("a failure was injected");
        let onset = s.onset_line.expect("onset line") as usize;
        assert!(lines[onset].contains("Xid") && lines[onset].contains(": 79,"));
        assert!(lines[onset].contains(s.culprit_node.as_deref().expect("culprit node")));
        let timeouts = lines
            .iter()
            .filter(|l| l.contains("Watchdog caught collective operation timeout"))
            .count();
        assert_eq!(timeouts, 8);
        let behind = lines
            .iter()
            .find(|l| {
                l.contains(&format!("[rank{culprit}]:")) && l.contains("Timeout at NCCL work")
            })
            .expect("culprit's timeout line");
        let others = lines
            .iter()
            .find(|l| {
                !l.contains(&format!("[rank{culprit}]:")) && l.contains("Timeout at NCCL work")
            })
            .expect("another rank's timeout line");
        assert_ne!(behind.split("work: ").nth(1), others.split("work: ").nth(1));
        for &id in &s.fault_lines {
            assert!(id >= s.lines - 100, "fault line {id} is near the end");
        }
        assert!(text.contains("NCCL WARN NET/IB"));
        assert!(text.contains("CUDA out of memory"));
        assert!(text.contains("NCCL INFO Channel"));
        assert!(text.contains("lm loss:"));
    }

    #[test]
    fn timestamps_are_utc_civil_dates() {
        let mut s = String::new();
        format_ts(&mut s, 1_715_655_600_000 + 45_123);
        assert_eq!(s, "2024-05-14T03:00:45.123Z");
        s.clear();
        format_ts(&mut s, 951_782_400_000); // 2000-02-29T00:00:00Z, a leap day
        assert_eq!(s, "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn no_failure_when_not_asked() {
        let mut buf = Vec::new();
        let s = write_log(
            &GenConfig {
                inject_failure: false,
                ..small()
            },
            &mut buf,
        )
        .expect("write to memory");
        assert!(s.culprit_rank.is_none() && s.fault_lines.is_empty());
        let text = String::from_utf8(buf).expect("UTF-8");
        assert!(!text.contains("Watchdog caught"));
    }
}
