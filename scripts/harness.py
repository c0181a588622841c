"""The harness the real-job scripts share (scripts/gpu-check, scripts/job-matrix): a
controller and two node agents on this machine (or one, with `nodes` 1), and torchrun
jobs of integrations/python/examples/train_ddp.py reporting to them.

`args` is the scripts' parsed command line: `bin` (the folder with warden-controller and
warden-agent), `out` (logs), `backend` (gloo or nccl), `python` (the Python with torch)
and, optionally, `launch`: "rank" (one torchrun per rank, each its own NCCL host; the
default) or "node" (one torchrun per node with its ranks, as a cluster runs a job), and
`flush_ms`: the agents' flush interval (default 100 ms; None for the agent's default),
`nodes`: how many of NODES take part (default 2; with 1, every rank is on node-a and
reports to its one agent), and `tail_logs`: the agents follow the jobs' logs (each
launch's output, in `out/<node>/logs/<job>/`), read each rank's `step N loss X` lines
and torchrun's failure reports, as they would a job that nothing else reports on.
"""

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(REPO, "integrations/python/examples/train_ddp.py")
NODES = ["node-a", "node-b"]


def nodes_of_args(args):
    """The nodes taking part: the first `args.nodes` of NODES (default both)."""
    return NODES[: getattr(args, "nodes", len(NODES))]


def node_of_rank(nodes, ranks, r):
    """The node of rank `r` of `ranks`, split evenly over `nodes`, the first share on the
    first node."""
    return nodes[r * len(nodes) // ranks]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_RENDEZVOUS_TAKEN = 0


def rendezvous_port():
    """A free port below the kernel's ephemeral range, for torchrun to bind once torch is
    imported: in that range any outgoing connection (gloo opens dozens) may take it as
    its source port meanwhile, and the store then fails with EADDRINUSE. Ports handed
    out by one process differ."""
    global _RENDEZVOUS_TAKEN
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            high = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        high = 32768
    start = 20000 + (os.getpid() * 7919 + _RENDEZVOUS_TAKEN) % max(1, high - 20000)
    for k in range(high - 20000):
        port = 20000 + (start - 20000 + k) % (high - 20000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _RENDEZVOUS_TAKEN += k + 1
            return port
    raise RuntimeError("no free port between 20000 and %d" % high)


def get(port, path, timeout=2.0):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=timeout) as r:
            return r.read().decode()
    except Exception:
        return None


def get_json(port, path):
    body = get(port, path)
    try:
        return json.loads(body) if body is not None else None
    except ValueError:
        return None


DEADLINE = [float("inf")]


def wait_for(what, limit, probe, every=0.1):
    """`probe()`'s first truthy value within `limit` seconds (and before the run's
    deadline), else None."""
    end = min(time.monotonic() + limit, DEADLINE[0])
    while time.monotonic() < end:
        v = probe()
        if v:
            return v
        time.sleep(every)
    print("harness: gave up waiting for %s after %.0f s" % (what, limit), flush=True)
    return None


class Procs:
    """Every process started, stopped (and continued, then killed) at the end."""

    def __init__(self):
        self.children = []
        self.jobs = []

    def start(self, args, log, env=None, group=False):
        f = open(log, "ab")
        p = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=group)
        self.children.append((p, group))
        return p

    def stop(self, p, group):
        if p.poll() is not None:
            return
        try:
            if group:
                os.killpg(p.pid, signal.SIGCONT)
                os.killpg(p.pid, signal.SIGKILL)
            else:
                p.kill()
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def close(self):
        for job in self.jobs:
            job.stop()
        for p, group in reversed(self.children):
            self.stop(p, group)


class Cluster:
    def __init__(self, args, procs):
        self.args = args
        self.procs = procs
        self.out = args.out
        self.port = free_port()
        self.agents = {}
        self.nodes = nodes_of_args(args)
        procs.start(
            [os.path.join(args.bin, "warden-controller"), "--listen", "127.0.0.1:%d" % self.port,
             "--data-dir", os.path.join(self.out, "controller-data")],
            os.path.join(self.out, "controller.log"),
            env=dict(os.environ, RUST_LOG="warn"),
        )
        if not wait_for("the controller", 30, lambda: get(self.port, "/healthz")):
            raise SystemExit("harness: the controller did not start (controller.log)")
        # The agents' flush interval: `flush_ms` (ms), or the agent's default when None.
        flush_ms = getattr(args, "flush_ms", 100)
        flush = "  flush_interval_ms: %d\n" % flush_ms if flush_ms is not None else ""
        for node in self.nodes:
            d = os.path.join(self.out, node)
            os.makedirs(os.path.join(d, "shm"), exist_ok=True)
            open(os.path.join(d, "kern.log"), "w").close()
            with open(os.path.join(d, "boot_id"), "w") as f:
                f.write("boot-%s\n" % node)
            port = free_port()
            logs = ""
            if getattr(args, "tail_logs", False):
                # The node's share of the ranks: torchrun's `[default1]:` prefix is a
                # local rank, and node-b's local rank 0 is rank ranks/2 (one node: 0).
                offset = self.nodes.index(node) * (getattr(args, "ranks", 4) // len(self.nodes))
                logs = (
                    "logs:\n  sources:\n"
                    "    - paths: [\"%s/logs/*/*.log\"]\n"
                    "      job_from_dir: 1\n      local_rank_offset: %d\n      presets: []\n"
                    "      patterns:\n        - name: step-loss\n"
                    "          regex: 'step (?P<step>\\d+) loss (?P<loss>%%NUM%%)'\n"
                    "          needle: ' loss '\n"
                    % (d, offset)
                )
            cfg = os.path.join(d, "agent.yaml")
            with open(cfg, "w") as f:
                f.write(
                    "node_name: %s\nlisten: 127.0.0.1:%d\n"
                    "controller:\n  url: http://127.0.0.1:%d\n%s"
                    "nvml:\n  enabled: %s\n  interval_ms: 1000\n"
                    "kmsg:\n  path: %s\n  boot_id_path: %s\n"
                    "capture:\n  socket: %s\n  shm_dir: %s\n%s"
                    % (node, port, self.port, flush, "true" if args.backend == "nccl" else "false",
                       os.path.join(d, "kern.log"), os.path.join(d, "boot_id"),
                       os.path.join(d, "capture.sock"), os.path.join(d, "shm"), logs)
                )
            procs.start([os.path.join(args.bin, "warden-agent"), "--config", cfg],
                        os.path.join(self.out, "agent-%s.log" % node))
            self.agents[node] = port
        for node, port in self.agents.items():
            if not wait_for("agent " + node, 30, lambda: get(port, "/healthz")):
                raise SystemExit("harness: agent %s did not start (agent-%s.log)" % (node, node))

    def incidents(self, job):
        return get_json(self.port, "/api/v1/incidents?job=" + job) or []


class Job:
    """One torchrun launch per rank (each its own NCCL host), or per node with
    `launch` "node"; ranks split evenly over the cluster's nodes, the first share on
    node-a (with one node, all of them)."""

    def __init__(self, cluster, name, ranks, train_args, plugin, extra_env=None):
        self.cluster = cluster
        self.name = name
        self.work = os.path.join(cluster.out, name)
        os.makedirs(self.work, exist_ok=True)
        master = str(rendezvous_port())
        self.launches = []
        cluster.procs.jobs.append(self)
        a = cluster.args
        per_node = getattr(a, "launch", "rank") == "node"
        self.ranks = ranks
        nodes = cluster.nodes
        for r in range(len(nodes) if per_node else ranks):
            node = nodes[r] if per_node else node_of_rank(nodes, ranks, r)
            d = os.path.join(cluster.out, node)
            env = dict(os.environ)
            env.update({
                "WARDEN_JOB": name,
                "WARDEN_AGENT_SOCKET": os.path.join(d, "capture.sock"),
                "WARDEN_SHM_DIR": os.path.join(d, "shm"),
                "PYTHONPATH": os.path.join(REPO, "integrations/python"),
                "PYTHONUNBUFFERED": "1",
                "OMP_NUM_THREADS": "1",
                "GLOO_SOCKET_IFNAME": "lo",
                "NCCL_SOCKET_IFNAME": "lo",
                "NCCL_HOSTID": "%s-rank%d" % (name, r),
                "NCCL_DEBUG": "INFO",
                "NCCL_DEBUG_SUBSYS": "INIT,ENV,NET",
            })
            if plugin:
                env["NCCL_PROFILER_PLUGIN"] = os.path.join(a.bin, "libwarden_nccl_profiler.so")
            env.update(extra_env or {})
            if per_node:
                env.pop("NCCL_HOSTID")
            # With the logs followed, each line of a rank says its local rank (`--tee`).
            tee = ["--tee=3"] if getattr(a, "tail_logs", False) else []
            launches = len(nodes) if per_node else ranks
            cmd = [a.python, "-m", "torch.distributed.run", "--nnodes=%d" % launches,
                   "--node-rank=%d" % r, "--nproc-per-node=%d" % (ranks // launches),
                   "--master-addr=127.0.0.1",
                   "--master-port=" + master, "--monitor-interval=0.1"] + tee + [TRAIN,
                   "--backend", a.backend, "--pid-dir", self.work] + train_args
            log = ("%s.log" % node) if per_node else ("rank%d.log" % r)
            logs = os.path.join(cluster.out, node, "logs", name)
            os.makedirs(logs, exist_ok=True)
            p = cluster.procs.start(cmd, os.path.join(logs, log), env=env, group=True)
            self.launches.append(p)

    def step(self):
        try:
            with open(os.path.join(self.work, "steps.log")) as f:
                lines = f.read().split()
            return int(lines[-2]) if len(lines) >= 2 else 0
        except (OSError, ValueError):
            return 0

    def wait_step(self, n, limit):
        return wait_for("%s step %d" % (self.name, n), limit, lambda: self.step() >= n or None)

    def signal(self, rank, sig):
        with open(os.path.join(self.work, "rank%d.pid" % rank)) as f:
            os.kill(int(f.read().strip()), sig)

    def wait_incident(self, kind, limit):
        def probe():
            for i in self.cluster.incidents(self.name):
                if i.get("kind") == kind and i.get("detected_s") is not None:
                    return i
            return None

        return wait_for("a %s incident of %s" % (kind, self.name), limit, probe)

    def finish(self, limit):
        end = min(time.monotonic() + limit, DEADLINE[0])
        for p in self.launches:
            try:
                p.wait(timeout=max(end - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                return False
        return all(p.returncode == 0 for p in self.launches)

    def stop(self):
        # torchrun starts each worker in a session of its own: kill the workers by
        # their pids, then the launchers.
        for name in os.listdir(self.work):
            if name.startswith("rank") and name.endswith(".pid"):
                try:
                    with open(os.path.join(self.work, name)) as f:
                        pid = int(f.read().strip())
                    os.kill(pid, signal.SIGCONT)
                    os.kill(pid, signal.SIGKILL)
                except (OSError, ValueError):
                    pass
        for p in self.launches:
            self.cluster.procs.stop(p, True)

    def log(self, rank):
        """The log of `rank`'s launch (per node: its node's, every rank of it)."""
        per_node = getattr(self.cluster.args, "launch", "rank") == "node"
        node = node_of_rank(self.cluster.nodes, self.ranks, rank)
        name = node if per_node else "rank%d" % rank
        try:
            with open(os.path.join(self.cluster.out, node, "logs", self.name, name + ".log"),
                      errors="replace") as f:
                return f.read()
        except OSError:
            return ""


def culprits(i):
    return sorted(i.get("ranks") or [])


def brief(i):
    keys = ("id", "kind", "state", "ranks", "nodes", "summary", "onset_s", "detected_s", "confidence")
    return {k: i.get(k) for k in keys}
