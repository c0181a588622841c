//! The job's layout: ranks on nodes and GPUs, 3D-parallel coordinates, and the TP, PP
//! and DP communicators with their hashes and names.

use warden_model::wire::CollOp;

use crate::scenario::{Capture, Scenario};

/// The three kinds of communicator a 3D-parallel job has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CommKind {
    /// Tensor parallel (innermost; usually inside one node).
    Tp,
    /// Pipeline parallel (stage-to-stage exchange).
    Pp,
    /// Data parallel (gradient allreduce).
    Dp,
}

impl CommKind {
    /// Short label used in communicator names.
    pub fn label(self) -> &'static str {
        match self {
            CommKind::Tp => "tp",
            CommKind::Pp => "pp",
            CommKind::Dp => "dp",
        }
    }

    /// Operation the job runs on this kind of communicator.
    pub fn op(self) -> CollOp {
        match self {
            CommKind::Pp => CollOp::SendRecv,
            CommKind::Tp | CommKind::Dp => CollOp::AllReduce,
        }
    }

    /// Payload of one collective, bytes.
    pub fn bytes(self) -> u64 {
        match self {
            CommKind::Tp => 64 << 20,
            CommKind::Pp => 32 << 20,
            CommKind::Dp => 512 << 20,
        }
    }

    /// Nominal transfer time as a fraction of the iteration time.
    pub fn base_fraction(self) -> f64 {
        match self {
            CommKind::Tp => 0.004,
            CommKind::Pp => 0.01,
            CommKind::Dp => 0.04,
        }
    }
}

/// One communicator: members are `base + stride * k` for `k` in `0..size`.
#[derive(Debug, Clone)]
pub struct Comm {
    /// Kind.
    pub kind: CommKind,
    /// Position among communicators of its kind.
    pub index: u32,
    /// 64-bit hash (NCCL's `commHash` stand-in).
    pub hash: u64,
    /// Human name, e.g. `dp-3`.
    pub name: String,
    /// Global rank of member 0.
    pub base: u32,
    /// Distance between consecutive members.
    pub stride: u32,
    /// Number of members.
    pub size: u32,
    /// Whether its members live on more than one node (so it uses the network).
    pub spans_nodes: bool,
}

impl Comm {
    /// Global rank of member `k`.
    pub fn member(&self, k: u32) -> u32 {
        self.base + self.stride * k
    }

    /// Global ranks of all members.
    pub fn members(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.size).map(|k| self.member(k))
    }
}

pub use warden_model::ids::fnv1a;

/// One direction between two adjacent stages of a pipeline group: what both capture
/// paths report point-to-point traffic on, a communicator of two members, the sender 0.
#[derive(Debug, Clone)]
pub struct Pair {
    /// Index of the pipeline group (its PP communicator).
    pub group: u32,
    /// Stage of the sender.
    pub src_stage: u32,
    /// Stage of the receiver.
    pub dst_stage: u32,
    /// Global rank of the sender.
    pub src: u32,
    /// Global rank of the receiver.
    pub dst: u32,
    /// Communicator id, as the capture path derives it from the name.
    pub hash: u64,
    /// Name as the capture path reports it.
    pub name: String,
    /// Whether sender and receiver are on different nodes.
    pub spans_nodes: bool,
}

impl Pair {
    /// The pair of `group` (a PP communicator) from stage `src` to stage `dst`, named as
    /// `capture` names it: `warden_torch` by process group (`pg:<group>:p2p:<src>><dst>`),
    /// the NCCL plugin by communicator hash (`nccl:<hash>:p2p:<src>><dst>`), both in
    /// ranks of the group.
    fn new(group: &Comm, src: u32, dst: u32, capture: Capture, gpn: u32) -> Pair {
        let name = match capture {
            Capture::Torch => format!("pg:{}:p2p:{src}>{dst}", group.name),
            Capture::Nccl | Capture::NcclProxy => {
                format!("nccl:{:016x}:p2p:{src}>{dst}", group.hash)
            }
        };
        let (s, d) = (group.member(src), group.member(dst));
        Pair {
            group: group.index,
            src_stage: src,
            dst_stage: dst,
            src: s,
            dst: d,
            hash: fnv1a(name.as_bytes()),
            name,
            spans_nodes: s / gpn != d / gpn,
        }
    }
}

/// Ranks, nodes and communicators of one job.
#[derive(Debug, Clone)]
pub struct Topology {
    /// Number of ranks.
    pub world: u32,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// Tensor-parallel degree.
    pub tp: u32,
    /// Pipeline-parallel degree.
    pub pp: u32,
    /// Data-parallel degree.
    pub dp: u32,
    /// Node names by index.
    pub node_names: Vec<String>,
    /// TP communicators (empty when tp = 1), indexed by `d + dp * p`.
    pub tp_comms: Vec<Comm>,
    /// DP communicators (empty when dp = 1), indexed by `t + tp * p`.
    pub dp_comms: Vec<Comm>,
    /// PP communicators (empty when pp = 1), indexed by `t + tp * d`: the pipeline
    /// groups. Capture reports their traffic on [`Pair`]s, never on these.
    pub pp_comms: Vec<Comm>,
    /// Point-to-point pairs of each pipeline group: forward `s>s+1` for each stage `s`,
    /// then backward `s+1>s`, at `2 * (pp - 1) * group + ..`.
    pub pairs: Vec<Pair>,
}

impl Topology {
    /// The layout of `scenario`'s job.
    pub fn new(scenario: &Scenario) -> Self {
        let j = &scenario.job;
        let (tp, pp, dp) = (j.tp, j.pp, j.dp);
        let gpn = j.gpus_per_node;
        let world = scenario.ranks();
        let node_names = (0..j.nodes).map(|i| scenario.node_name(i)).collect();
        let make = |kind: CommKind, index: u32, base: u32, stride: u32, size: u32| {
            let first_node = base / gpn;
            let last_node = (base + stride * (size - 1)) / gpn;
            Comm {
                kind,
                index,
                hash: fnv1a(format!("{}/{}/{}", j.name, kind.label(), index).as_bytes()),
                name: format!("{}-{}", kind.label(), index),
                base,
                stride,
                size,
                spans_nodes: first_node != last_node,
            }
        };
        let mut tp_comms = vec![];
        if tp > 1 {
            for p in 0..pp {
                for d in 0..dp {
                    let g = d + dp * p;
                    tp_comms.push(make(CommKind::Tp, g, tp * g, 1, tp));
                }
            }
        }
        let mut dp_comms = vec![];
        if dp > 1 {
            for p in 0..pp {
                for t in 0..tp {
                    dp_comms.push(make(CommKind::Dp, t + tp * p, t + tp * dp * p, tp, dp));
                }
            }
        }
        let mut pp_comms = vec![];
        if pp > 1 {
            for d in 0..dp {
                for t in 0..tp {
                    pp_comms.push(make(CommKind::Pp, t + tp * d, t + tp * d, tp * dp, pp));
                }
            }
        }
        let mut pairs = vec![];
        for g in &pp_comms {
            for s in 0..pp - 1 {
                pairs.push(Pair::new(g, s, s + 1, scenario.capture, gpn));
            }
            for s in 0..pp - 1 {
                pairs.push(Pair::new(g, s + 1, s, scenario.capture, gpn));
            }
        }
        Topology {
            world,
            gpus_per_node: gpn,
            tp,
            pp,
            dp,
            node_names,
            tp_comms,
            dp_comms,
            pp_comms,
            pairs,
        }
    }

    /// Node index of rank `r`.
    pub fn node_of(&self, r: u32) -> u32 {
        r / self.gpus_per_node
    }

    /// GPU index of rank `r` on its node.
    pub fn gpu_of(&self, r: u32) -> u32 {
        r % self.gpus_per_node
    }

    /// Parallel coordinates `(t, d, p)` of rank `r`.
    pub fn coords(&self, r: u32) -> (u32, u32, u32) {
        (
            r % self.tp,
            (r / self.tp) % self.dp,
            r / (self.tp * self.dp),
        )
    }

    /// The communicators rank `r` belongs to, with its rank in each (pipeline groups
    /// included, which capture never reports; see [`Topology::registered_comms_of`]).
    pub fn comms_of(&self, r: u32) -> Vec<(&Comm, u32)> {
        let (t, d, p) = self.coords(r);
        let mut v = vec![];
        if let Some(c) = self.tp_comms.get((d + self.dp * p) as usize) {
            v.push((c, t));
        }
        if let Some(c) = self.pp_comms.get((t + self.tp * d) as usize) {
            v.push((c, p));
        }
        if let Some(c) = self.dp_comms.get((t + self.tp * p) as usize) {
            v.push((c, d));
        }
        v
    }

    /// The pairs of pipeline group `group`.
    pub fn pairs_of_group(&self, group: u32) -> &[Pair] {
        let n = 2 * (self.pp.saturating_sub(1)) as usize;
        let from = group as usize * n;
        self.pairs.get(from..from + n).unwrap_or(&[])
    }

    /// What capture registers for rank `r`: `(id, name, size, rank in it)` of its TP
    /// and DP communicators and of the pairs it sends or receives on.
    pub fn registered_comms_of(&self, r: u32) -> Vec<(u64, &str, u32, u32)> {
        let (t, d, _) = self.coords(r);
        let mut v: Vec<(u64, &str, u32, u32)> = self
            .comms_of(r)
            .into_iter()
            .filter(|(c, _)| c.kind != CommKind::Pp)
            .map(|(c, k)| (c.hash, c.name.as_str(), c.size, k))
            .collect();
        if self.pp > 1 {
            for pr in self.pairs_of_group(t + self.tp * d) {
                if pr.src == r {
                    v.push((pr.hash, pr.name.as_str(), 2, 0));
                } else if pr.dst == r {
                    v.push((pr.hash, pr.name.as_str(), 2, 1));
                }
            }
        }
        v
    }

    /// Communicators of one kind.
    pub fn comms(&self, kind: CommKind) -> &[Comm] {
        match kind {
            CommKind::Tp => &self.tp_comms,
            CommKind::Pp => &self.pp_comms,
            CommKind::Dp => &self.dp_comms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topo(yaml: &str) -> Topology {
        Topology::new(&Scenario::from_yaml(yaml, "t").expect("valid"))
    }

    #[test]
    fn every_rank_is_in_each_comm_of_its_coordinates_once() {
        let t = topo(
            "job: {nodes: 4, gpus_per_node: 4, parallelism: {tp: 2, pp: 2, dp: 4}}\nsteps: 1\n",
        );
        assert_eq!(
            (t.tp_comms.len(), t.pp_comms.len(), t.dp_comms.len()),
            (8, 8, 4)
        );
        for r in 0..t.world {
            let (tc, dc, pc) = t.coords(r);
            assert_eq!(r, tc + t.tp * (dc + t.dp * pc));
            let comms = t.comms_of(r);
            assert_eq!(comms.len(), 3);
            for (c, k) in comms {
                assert_eq!(c.member(k), r, "{} does not hold {r}", c.name);
            }
        }
        assert!(!t.tp_comms[0].spans_nodes);
        assert!(t.dp_comms[0].spans_nodes);
        let mut hashes: Vec<u64> = [&t.tp_comms, &t.pp_comms, &t.dp_comms]
            .iter()
            .flat_map(|v| v.iter().map(|c| c.hash))
            .collect();
        hashes.sort_unstable();
        hashes.dedup();
        assert_eq!(hashes.len(), 20);
    }

    #[test]
    fn size_one_comms_do_not_exist() {
        let t = topo(
            "job: {nodes: 2, gpus_per_node: 4, parallelism: {tp: 1, pp: 1, dp: 8}}\nsteps: 1\n",
        );
        assert!(t.tp_comms.is_empty() && t.pp_comms.is_empty());
        assert_eq!(t.dp_comms.len(), 1);
        assert_eq!(
            t.dp_comms[0].members().collect::<Vec<_>>(),
            (0..8).collect::<Vec<_>>()
        );
    }
}
