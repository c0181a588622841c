//! Which job and rank a log line belongs to.
//!
//! Three places say something, and they are weighed in this order.
//!
//! Job:
//! 1. the source config's `job`, or the folder its `job_from_dir` names;
//! 2. the path: a CRI pod log's pod name without its replica suffix
//!    (`llama-worker-3` → `llama`, `llama-master-0` → `llama`, JobSet's
//!    `llama-node-0-3-xk2pq` → `llama`, an indexed Job's `llama-3-xk2pq` → `llama`), or
//!    Slurm's default output name `slurm-<job id>.out` → the job id.
//!
//! A job called `none` (plain torchrun's run id) is no job.
//!
//! Rank (global):
//! 1. the source config's `rank`;
//! 2. the line's `[rank3]:` prefix (PyTorch prints the global rank there), or the MPI
//!    rank of `mpirun --tag-output`'s `[1,3]<stdout>:` prefix;
//! 3. the path: a component or file name with `rank3`, `rank_3` or `rank-3`;
//! 4. a `[Rank 3]` tag in the line (DeepSpeed's `log_dist`, ProcessGroupNCCL of the
//!    default group);
//! 5. a local rank plus a base: torchrun's `--tee` prefix `[default3]:` (any role name:
//!    `[trainer3]:`) and its `--log-dir` layout `attempt_0/3/stdout.log` give the local
//!    rank 3, which is a global rank only with the source's `local_rank_offset` (global
//!    rank of local rank 0 on this node) or, for pods, `ranks_per_pod` times the pod's
//!    index; without either, the local rank is reported as such and the rank left
//!    unknown;
//! 6. the pod's index alone, when `ranks_per_pod` is 1.
//!
//! A pod index is taken only where it is unambiguous: `-master-0` is the first pod; an
//! indexed Job's `-<index>-<random>` and a JobSet's `-<job index>-<pod index>-<random>`
//! with job index 0 give the pod index. A PyTorchJob's `-worker-N` does not (it is pod
//! N+1 when the job has a master replica, pod N when it has none).
//!
//! Environment files (a `RANK=` file next to the log) are not read: no convention for
//! them is common enough to be worth the IO.

use std::sync::{Arc, OnceLock};

use regex::Regex;
use warden_model::wire::LogStream;

use super::{SourceConfig, StreamName, cri};

/// What a line's own prefix says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinePrefix {
    /// Length of the prefix in bytes, up to and including its `:`.
    pub len: usize,
    /// What the number is.
    pub kind: PrefixKind,
    /// The number.
    pub n: u32,
    /// The stream the prefix names (`mpirun --tag-output`).
    pub stream: Option<LogStream>,
}

/// The kind of rank a line prefix carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefixKind {
    /// Global rank: PyTorch's `[rank3]:`, MPI's `[1,3]<stdout>:`.
    Global,
    /// Local rank: torchrun's `[default3]:` (`[<role><local rank>]:`).
    Local,
}

/// Parse the rank prefix at the start of a line, if any.
pub fn line_prefix(text: &str) -> Option<LinePrefix> {
    let b = text.as_bytes();
    if b.first() != Some(&b'[') {
        return None;
    }
    // `[<word><digits>]:`
    let word_end = b[1..]
        .iter()
        .position(|c| !(c.is_ascii_alphabetic() || *c == b'_'))
        .map_or(b.len(), |p| p + 1);
    if word_end > 1 {
        let digits_end = b[word_end..]
            .iter()
            .position(|c| !c.is_ascii_digit())
            .map_or(b.len(), |p| p + word_end);
        if digits_end > word_end
            && digits_end - word_end <= 9
            && b.get(digits_end) == Some(&b']')
            && b.get(digits_end + 1) == Some(&b':')
        {
            let n = text[word_end..digits_end].parse().ok()?;
            let kind = if &text[1..word_end] == "rank" {
                PrefixKind::Global
            } else {
                PrefixKind::Local
            };
            return Some(LinePrefix {
                len: digits_end + 2,
                kind,
                n,
                stream: None,
            });
        }
        return None;
    }
    // `[<job>,<rank>]<stdout>:` from `mpirun --tag-output`.
    let close = b.iter().position(|&c| c == b']')?;
    let (job, rank) = text[1..close].split_once(',')?;
    if job.is_empty() || !job.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let n: u32 = rank.parse().ok()?;
    let after = &text[close + 1..];
    let (stream, tag_len) = if after.starts_with("<stdout>:") {
        (LogStream::Stdout, 9)
    } else if after.starts_with("<stderr>:") {
        (LogStream::Stderr, 9)
    } else {
        return None;
    };
    Some(LinePrefix {
        len: close + 1 + tag_len,
        kind: PrefixKind::Global,
        n,
        stream: Some(stream),
    })
}

/// The `N` of the first `[Rank N]` tag in a line.
pub fn rank_tag(text: &str) -> Option<u32> {
    // `str::contains` has a SIMD path for short needles: the common miss is cheap.
    if !text.contains("[Rank ") {
        return None;
    }
    let (_, rest) = text.split_once("[Rank ")?;
    let n = &rest[..rest.find(']')?];
    if n.is_empty() || n.len() > 9 || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse().ok()
}

/// What a file's path and its source config say, worked out once per file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FileAttribution {
    /// Job, from the config or the path.
    pub job: Option<Arc<str>>,
    /// Static rank from the config.
    pub config_rank: Option<u32>,
    /// Rank from a `rank3` in the path.
    pub path_rank: Option<u32>,
    /// Local rank from torchrun's log-dir layout.
    pub path_local_rank: Option<u32>,
    /// Global rank of local rank 0 (config offset, or pod index times ranks per pod).
    pub local_rank_base: Option<u32>,
    /// The pod's rank when each pod runs one rank.
    pub pod_rank: Option<u32>,
    /// Stream of a plain file.
    pub stream: LogStream,
}

/// Where a rank came from, for tests and debugging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankSource {
    /// The source config's `rank`.
    Config,
    /// A `[rankN]:` / `[1,N]<stdout>:` prefix.
    LinePrefix,
    /// The path.
    Path,
    /// A `[Rank N]` tag.
    RankTag,
    /// A local rank plus a base.
    LocalRank,
    /// The pod index.
    Pod,
}

impl FileAttribution {
    /// Work out what `path` and its source say.
    pub fn for_path(path: &str, source: &SourceConfig) -> Self {
        let pod = cri::parse_pod_log_path(path);
        let pod_name = pod.as_ref().map(|p| split_pod_name(&p.pod));
        let job = source
            .job
            .as_deref()
            .map(str::to_string)
            .or_else(|| dir_job(path, source.job_from_dir?))
            .or_else(|| pod_name.as_ref().map(|p| p.job.clone()))
            .or_else(|| slurm_job(path))
            .filter(|j| is_job_name(j))
            .map(Arc::from);
        let pod_index = pod_name.as_ref().and_then(|p| p.index);
        let local_rank_base = source.local_rank_offset.or_else(|| {
            let per = source.ranks_per_pod?;
            pod_index?.checked_mul(per)
        });
        let pod_rank = if source.ranks_per_pod == Some(1) {
            pod_index
        } else {
            None
        };
        let (path_local_rank, log_dir_stream) = torchrun_log_dir(path);
        let stream = match source.stream {
            Some(StreamName::Stdout) => LogStream::Stdout,
            Some(StreamName::Stderr) => LogStream::Stderr,
            None => log_dir_stream.unwrap_or_else(|| stream_from_name(path)),
        };
        FileAttribution {
            job,
            config_rank: source.rank,
            path_rank: path_rank(path),
            path_local_rank,
            local_rank_base,
            pod_rank,
            stream,
        }
    }

    /// Rank and local rank of one line of this file, with where the rank came from.
    pub fn rank_of(
        &self,
        text: &str,
        prefix: Option<&LinePrefix>,
    ) -> (Option<u32>, Option<u32>, Option<RankSource>) {
        let local = match prefix {
            Some(p) if p.kind == PrefixKind::Local => Some(p.n),
            _ => self.path_local_rank,
        };
        if let Some(r) = self.config_rank {
            return (Some(r), local, Some(RankSource::Config));
        }
        if let Some(p) = prefix.filter(|p| p.kind == PrefixKind::Global) {
            return (Some(p.n), local, Some(RankSource::LinePrefix));
        }
        if let Some(r) = self.path_rank {
            return (Some(r), local, Some(RankSource::Path));
        }
        if let Some(r) = rank_tag(text) {
            return (Some(r), local, Some(RankSource::RankTag));
        }
        if let (Some(base), Some(l)) = (self.local_rank_base, local)
            && let Some(r) = base.checked_add(l)
        {
            return (Some(r), local, Some(RankSource::LocalRank));
        }
        if let Some(r) = self.pod_rank {
            return (Some(r), local, Some(RankSource::Pod));
        }
        (None, local, None)
    }
}

/// A pod name split into the job it belongs to and its replica index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodName {
    /// The job's name.
    pub job: String,
    /// The pod's index within the job, where unambiguous.
    pub index: Option<u32>,
}

/// Replica role words that Kubeflow operators, JobSet and Trainer put in pod names.
const ROLES: [&str; 12] = [
    "master",
    "worker",
    "workers",
    "launcher",
    "chief",
    "ps",
    "evaluator",
    "node",
    "trainer",
    "leader",
    "replica",
    "head",
];

/// Split a pod name into job and replica index (see the module doc for the forms).
pub fn split_pod_name(pod: &str) -> PodName {
    let mut toks: Vec<&str> = pod.split('-').collect();
    let is_num = |t: &str| !t.is_empty() && t.len() <= 9 && t.bytes().all(|b| b.is_ascii_digit());
    // A Job controller's random suffix: 5 characters of the generateName alphabet.
    let is_random = |t: &str| {
        t.len() == 5
            && t.bytes()
                .all(|b| b"bcdfghjklmnpqrstvwxz2456789".contains(&b))
    };
    let mut random = false;
    if toks.len() >= 3 && is_random(toks[toks.len() - 1]) {
        let before = toks[toks.len() - 2];
        if is_num(before) || ROLES.contains(&before) {
            toks.pop();
            random = true;
        }
    }
    let mut nums: Vec<u32> = Vec::new();
    while toks.len() > 1 && nums.len() < 2 {
        match toks.last() {
            Some(t) if is_num(t) => {
                nums.insert(0, t.parse().unwrap_or(u32::MAX));
                toks.pop();
            }
            _ => break,
        }
    }
    let mut role = None;
    if (!nums.is_empty() || random)
        && toks.len() > 1
        && let Some(t) = toks.last().copied()
        && ROLES.contains(&t)
    {
        role = Some(t);
        toks.pop();
    }
    let index = match (role, nums.as_slice()) {
        (Some("master" | "chief" | "leader" | "head"), [0]) => Some(0),
        (Some("master" | "chief" | "leader" | "head"), _) => None,
        (Some("worker" | "workers" | "ps" | "evaluator" | "launcher"), _) => None,
        (_, [i]) => Some(*i),
        (_, [0, i]) => Some(*i),
        _ => None,
    };
    let index = index.filter(|i| *i != u32::MAX);
    if toks.is_empty() || (nums.is_empty() && role.is_none()) {
        return PodName {
            job: pod.to_string(),
            index: None,
        };
    }
    PodName {
        job: toks.join("-"),
        index,
    }
}

/// Whether `name` can name a job: not empty, and not `none` (plain torchrun's
/// `TORCHELASTIC_RUN_ID`, the same for every job).
fn is_job_name(name: &str) -> bool {
    let n = name.trim();
    !n.is_empty() && !n.eq_ignore_ascii_case("none")
}

/// The name of the folder `levels` above the file at `path` (1: its own folder).
fn dir_job(path: &str, levels: u32) -> Option<String> {
    let mut parts = path.rsplit('/').filter(|p| !p.is_empty());
    parts.next()?; // the file
    let name = parts.nth(levels.checked_sub(1)? as usize)?;
    Some(name.to_string())
}

/// The job id of Slurm's default output file name, `slurm-<id>.out` / `slurm-<id>_<task>.out`.
fn slurm_job(path: &str) -> Option<String> {
    let file = path.rsplit('/').next()?;
    let stem = file.strip_prefix("slurm-")?;
    let id = stem
        .strip_suffix(".out")
        .or_else(|| stem.strip_suffix(".err"))?;
    let ok = !id.is_empty()
        && id.bytes().all(|b| b.is_ascii_digit() || b == b'_')
        && id.as_bytes()[0].is_ascii_digit();
    ok.then(|| id.to_string())
}

/// The number in the last `rank3` / `rank_3` / `rank-3` / `Rank3` of a path.
fn path_rank(path: &str) -> Option<u32> {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    let re = RE
        .get_or_init(|| Regex::new(r"(?i)(?:^|[^a-z0-9])rank[_-]?([0-9]{1,9})(?:[^0-9]|$)").ok())
        .as_ref()?;
    re.captures_iter(path)
        .last()
        .and_then(|c| c.get(1))
        .and_then(|m| m.as_str().parse().ok())
}

/// torchrun `--log-dir` layout: `.../attempt_<n>/<local rank>/{stdout,stderr}.log`.
fn torchrun_log_dir(path: &str) -> (Option<u32>, Option<LogStream>) {
    let mut parts = path.rsplit('/');
    let (Some(file), Some(dir), Some(attempt)) = (parts.next(), parts.next(), parts.next()) else {
        return (None, None);
    };
    let stream = match file {
        "stdout.log" => LogStream::Stdout,
        "stderr.log" => LogStream::Stderr,
        _ => return (None, None),
    };
    let is_attempt = attempt
        .strip_prefix("attempt_")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    if !is_attempt {
        return (None, None);
    }
    (dir.parse().ok(), Some(stream))
}

fn stream_from_name(path: &str) -> LogStream {
    let file = path.rsplit('/').next().unwrap_or(path);
    if file.contains("stderr") || file.ends_with(".err") {
        LogStream::Stderr
    } else {
        LogStream::Stdout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_prefixes() {
        let p = line_prefix("[rank3]: Traceback (most recent call last):").expect("rank prefix");
        assert_eq!((p.kind, p.n, p.len), (PrefixKind::Global, 3, 8));
        let p = line_prefix("[rank12]:[E1109 14:37:52.603 ProcessGroupNCCL.cpp:629] x")
            .expect("rank prefix without space");
        assert_eq!((p.kind, p.n, p.len), (PrefixKind::Global, 12, 9));
        let p = line_prefix("[default3]:iteration 10/100 |").expect("torchrun tee prefix");
        assert_eq!((p.kind, p.n, p.len), (PrefixKind::Local, 3, 11));
        let p = line_prefix("[trainer_a0]:x").expect("any role");
        assert_eq!((p.kind, p.n), (PrefixKind::Local, 0));
        let p = line_prefix("[1,5]<stderr>:RuntimeError: boom").expect("mpirun tag");
        assert_eq!((p.kind, p.n, p.len), (PrefixKind::Global, 5, 14));
        assert_eq!(p.stream, Some(LogStream::Stderr));
        for no in [
            "[E ProcessGroupNCCL.cpp:737] [Rank 5] Watchdog",
            "[Rank 0] step=10",
            "[rank3] missing colon",
            "[2024-05-01 12:00:00,000] [INFO]",
            "rank3: x",
            "[rank]: x",
            "[1,x]<stdout>:",
            "[]:",
            "",
        ] {
            assert_eq!(line_prefix(no), None, "{no}");
        }
    }

    #[test]
    fn rank_tags() {
        assert_eq!(
            rank_tag("[2023-07-24 12:25:17,424] [INFO] [logging.py:96:log_dist] [Rank 0] step=100"),
            Some(0)
        );
        assert_eq!(
            rank_tag("[E ProcessGroupNCCL.cpp:737] [Rank 5] Watchdog"),
            Some(5)
        );
        assert_eq!(rank_tag("[Rank x] y"), None);
        assert_eq!(rank_tag("no tag"), None);
    }

    #[test]
    fn pod_names() {
        let cases = [
            ("llama-master-0", "llama", Some(0)),
            ("llama-worker-3", "llama", None),
            ("llama-70b-worker-0", "llama-70b", None),
            ("llama-node-0-3-xk2pq", "llama", Some(3)),
            ("llama-node-1-3-xk2pq", "llama", None),
            ("llama-3-xk2pq", "llama", Some(3)),
            ("llama-workers-0-2-bc4df", "llama", None),
            ("mpi-launcher-xk2pq", "mpi", None),
            ("train-xk2pq", "train-xk2pq", None),
            ("standalone", "standalone", None),
            ("gpt-j-6b-7", "gpt-j-6b", Some(7)),
        ];
        for (pod, job, index) in cases {
            assert_eq!(
                split_pod_name(pod),
                PodName {
                    job: job.to_string(),
                    index
                },
                "{pod}"
            );
        }
    }

    #[test]
    fn a_job_comes_from_the_folder_the_config_names_and_none_is_no_job() {
        assert_eq!(
            dir_job("/scratch/runs/llama/rank3.log", 1).as_deref(),
            Some("llama")
        );
        assert_eq!(
            dir_job("/scratch/runs/llama/logs/rank3.log", 2).as_deref(),
            Some("llama")
        );
        assert_eq!(dir_job("rank3.log", 1), None);
        assert_eq!(dir_job("/a/b.log", 0), None);
        let a = attr("/scratch/runs/llama/rank3.log", |s| {
            s.job_from_dir = Some(1)
        });
        assert_eq!(a.job.as_deref(), Some("llama"));
        let a = attr("/scratch/runs/none/rank3.log", |s| s.job_from_dir = Some(1));
        assert_eq!(a.job, None);
        let a = attr("/scratch/x/rank3.log", |s| s.job = Some("None".into()));
        assert_eq!(a.job, None);
    }

    #[test]
    fn path_conventions() {
        assert_eq!(path_rank("/runs/a/logs/rank_3.log"), Some(3));
        assert_eq!(path_rank("/runs/a/rank3/stdout.txt"), Some(3));
        assert_eq!(path_rank("/runs/a/train-rank-12.txt"), Some(12));
        assert_eq!(path_rank("/runs/rank_1/sub/Rank7.log"), Some(7));
        assert_eq!(path_rank("/runs/cranky3/x.log"), None);
        assert_eq!(path_rank("/runs/ranking/x.log"), None);
        assert_eq!(
            slurm_job("/home/u/slurm-4471829.out"),
            Some("4471829".into())
        );
        assert_eq!(slurm_job("/home/u/slurm-12_3.out"), Some("12_3".into()));
        assert_eq!(slurm_job("/home/u/slurm-x.out"), None);
        assert_eq!(
            torchrun_log_dir("/tmp/torchelastic_ab/none_xy/attempt_0/3/stderr.log"),
            (Some(3), Some(LogStream::Stderr))
        );
        assert_eq!(torchrun_log_dir("/tmp/logs/3/stderr.log"), (None, None));
        assert_eq!(stream_from_name("/x/slurm-1.err"), LogStream::Stderr);
        assert_eq!(stream_from_name("/x/train.log"), LogStream::Stdout);
    }

    fn attr(path: &str, f: impl FnOnce(&mut SourceConfig)) -> FileAttribution {
        let mut s = SourceConfig::new([path]);
        f(&mut s);
        FileAttribution::for_path(path, &s)
    }

    #[test]
    fn precedence() {
        let pod = "/var/log/pods/ml_llama-node-0-2-xk2pq_0f1e2d3c/trainer/0.log";
        // Job from the pod name; rank only with ranks_per_pod.
        let a = attr(pod, |_| {});
        assert_eq!(a.job.as_deref(), Some("llama"));
        assert_eq!(a.rank_of("loss 1", None), (None, None, None));
        // One rank per pod: the pod index is the rank.
        let a = attr(pod, |s| s.ranks_per_pod = Some(1));
        assert_eq!(a.rank_of("x", None), (Some(2), None, Some(RankSource::Pod)));
        // Eight per pod: torchrun's local rank on top of the pod's base.
        let a = attr(pod, |s| s.ranks_per_pod = Some(8));
        let p = line_prefix("[default5]:x");
        assert_eq!(
            a.rank_of("[default5]:x", p.as_ref()),
            (Some(21), Some(5), Some(RankSource::LocalRank))
        );
        // Without a base the local rank stays local.
        let a = attr("/logs/train.log", |_| {});
        assert_eq!(a.rank_of("[default5]:x", p.as_ref()), (None, Some(5), None));
        // A global prefix beats the path, the path beats a [Rank N] tag.
        let a = attr("/logs/rank_4.log", |_| {});
        let g = line_prefix("[rank6]: x");
        assert_eq!(
            a.rank_of("[rank6]: x", g.as_ref()),
            (Some(6), None, Some(RankSource::LinePrefix))
        );
        assert_eq!(
            a.rank_of("[Rank 0] step=1", None),
            (Some(4), None, Some(RankSource::Path))
        );
        let a = attr("/logs/train.log", |_| {});
        assert_eq!(
            a.rank_of("[Rank 0] step=1", None),
            (Some(0), None, Some(RankSource::RankTag))
        );
        // The config beats everything, job included.
        let a = attr(pod, |s| {
            s.rank = Some(9);
            s.job = Some("mine".into());
        });
        assert_eq!(a.job.as_deref(), Some("mine"));
        assert_eq!(
            a.rank_of("[rank6]: x", g.as_ref()),
            (Some(9), None, Some(RankSource::Config))
        );
        // torchrun log dir plus a static offset.
        let a = attr("/tmp/te/run_1/attempt_0/3/stderr.log", |s| {
            s.local_rank_offset = Some(16)
        });
        assert_eq!(a.stream, LogStream::Stderr);
        assert_eq!(
            a.rank_of("x", None),
            (Some(19), Some(3), Some(RankSource::LocalRank))
        );
    }
}
