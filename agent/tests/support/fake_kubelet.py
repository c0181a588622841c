"""The kubelet's pod-resources gRPC service, for the agent's tests.

Serves `v1.PodResourcesLister/List` with grpcio (the reference gRPC server) on a unix
socket, as the kubelet does at /var/lib/kubelet/pod-resources/kubelet.sock. Each call
re-reads a JSON file, so a test can move GPUs between pods while the agent runs:

    [{"namespace": "train", "name": "llama-0",
      "containers": [{"name": "trainer", "cpu_ids": [2, 3],
                      "devices": [{"resource_name": "nvidia.com/gpu",
                                   "device_ids": ["GPU-..."], "numa": [0]}]}]}]

or {"error": "message"} to answer UNAVAILABLE. The reply is encoded here by hand from
the field numbers of the kubelet's pkg/apis/podresources/v1/api.proto, including the
fields the agent does not read (cpu_ids, topology, memory), so the agent's decoder is
checked against an encoding it did not make.

Usage: fake_kubelet.py SOCKET PODS_JSON. Prints "ready" once serving; runs until killed.
"""

import json
import sys
from concurrent import futures

import grpc


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def length_delimited(field, payload):
    return varint(field << 3 | 2) + varint(len(payload)) + payload


def string(field, s):
    return length_delimited(field, s.encode())


def packed_int64(field, values):
    return length_delimited(field, b"".join(varint(v) for v in values))


def topology(numa_nodes):
    # TopologyInfo { repeated NUMANode nodes = 1; }  NUMANode { int64 ID = 1; }
    return b"".join(length_delimited(1, varint(1 << 3 | 0) + varint(n)) for n in numa_nodes)


def container(c):
    out = string(1, c["name"])
    for d in c.get("devices", []):
        dev = string(1, d["resource_name"])
        for i in d["device_ids"]:
            dev += string(2, i)
        if "numa" in d:
            dev += length_delimited(3, topology(d["numa"]))
        out += length_delimited(2, dev)
    if c.get("cpu_ids"):
        out += packed_int64(3, c["cpu_ids"])
    # ContainerMemory { string memory_type = 1; uint64 size = 2; }
    out += length_delimited(4, string(1, "memory") + varint(2 << 3 | 0) + varint(1 << 30))
    return out


def list_reply(pods):
    out = b""
    for p in pods:
        pod = string(1, p["name"]) + string(2, p["namespace"])
        for c in p.get("containers", []):
            pod += length_delimited(3, container(c))
        out += length_delimited(1, pod)
    return out


def main():
    socket, pods_file = sys.argv[1], sys.argv[2]

    def list_pods(request, context):
        with open(pods_file) as f:
            pods = json.load(f)
        if isinstance(pods, dict) and "error" in pods:
            context.abort(grpc.StatusCode.UNAVAILABLE, pods["error"])
        return list_reply(pods)

    handler = grpc.method_handlers_generic_handler(
        "v1.PodResourcesLister",
        {"List": grpc.unary_unary_rpc_method_handler(list_pods)},
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    if server.add_insecure_port("unix:" + socket) == 0:
        sys.exit("cannot listen on " + socket)
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
