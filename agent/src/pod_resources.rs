//! The pod, namespace and container each GPU is assigned to, read from the kubelet's
//! pod-resources gRPC API (`v1.PodResourcesLister/List` on a unix socket), so the GPU
//! metrics carry the `pod`, `namespace` and `container` labels dcgm-exporter gives them.
//!
//! The client speaks gRPC's unary call directly over HTTP/2 (one POST, one
//! length-prefixed protobuf message each way, the status in the trailers); the messages
//! below keep only the fields Warden reads, with the tag numbers of the kubelet's
//! `pkg/apis/podresources/v1/api.proto`, and skip the rest as protobuf allows.
//!
//! The socket is root's (mode 0755 under `/var/lib/kubelet/pod-resources`), so the
//! agent connects once before it gives up its capabilities
//! ([`crate::privilege::preopen`]) and keeps that connection; when the kubelet closes it
//! (a kubelet restart), the agent connects again, which works only where the socket is
//! writable by the agent's user. Until then the last assignment is kept and
//! `warden_agent_collector_up{collector="pod_resources"}` is 0.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http2::SendRequest;
use hyper::header::{CONTENT_TYPE, HeaderMap, HeaderValue, TE};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};

/// Where the kubelet serves the pod-resources API.
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
/// The gRPC method: package `v1`, service `PodResourcesLister`, method `List`.
pub const LIST_PATH: &str = "/v1.PodResourcesLister/List";
/// The resource names of NVIDIA's device plugin: whole GPUs, and shared (time-sliced)
/// GPUs when the plugin renames them.
pub const DEFAULT_RESOURCES: [&str; 2] = ["nvidia.com/gpu", "nvidia.com/gpu.shared"];
/// Largest reply read: the kubelet's own gRPC limit is 16 MiB.
pub const MAX_REPLY_BYTES: usize = 16 << 20;

/// `ListPodResourcesResponse { repeated PodResources pod_resources = 1; }`
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodResourcesResponse {
    /// Every pod on the node that holds resources.
    #[prost(message, repeated, tag = "1")]
    pub pod_resources: Vec<PodResources>,
}

/// `PodResources { string name = 1; string namespace = 2; repeated ContainerResources containers = 3; }`
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodResources {
    /// Pod name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Pod namespace.
    #[prost(string, tag = "2")]
    pub namespace: String,
    /// Its containers.
    #[prost(message, repeated, tag = "3")]
    pub containers: Vec<ContainerResources>,
}

/// `ContainerResources { string name = 1; repeated ContainerDevices devices = 2; ... }`
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerResources {
    /// Container name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Devices from device plugins.
    #[prost(message, repeated, tag = "2")]
    pub devices: Vec<ContainerDevices>,
}

/// `ContainerDevices { string resource_name = 1; repeated string device_ids = 2; ... }`
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerDevices {
    /// The extended resource, `nvidia.com/gpu`.
    #[prost(string, tag = "1")]
    pub resource_name: String,
    /// The device plugin's ids: GPU UUIDs for NVIDIA's.
    #[prost(string, repeated, tag = "2")]
    pub device_ids: Vec<String>,
}

/// The container a GPU is assigned to.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodRef {
    /// Namespace of the pod.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name.
    pub container: String,
}

/// GPU UUID → the container it is assigned to.
pub type GpuPods = BTreeMap<String, PodRef>;

/// The current assignment, shared between the poller and the GPU metrics.
pub type SharedGpuPods = Arc<Mutex<GpuPods>>;

/// Read a shared assignment.
pub fn snapshot(pods: &SharedGpuPods) -> GpuPods {
    pods.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

/// The GPU → container assignment in `reply`, for the device-plugin resources named in
/// `resources`. A time-sliced replica id (`GPU-…::3`) counts as its GPU. A GPU shared by
/// several containers is shown as the first of them in (namespace, pod, container)
/// order, so the labels do not flap between polls.
pub fn gpu_pods(reply: &ListPodResourcesResponse, resources: &[String]) -> GpuPods {
    let mut out = GpuPods::new();
    for pod in &reply.pod_resources {
        for c in &pod.containers {
            for d in c
                .devices
                .iter()
                .filter(|d| resources.contains(&d.resource_name))
            {
                for id in &d.device_ids {
                    let uuid = id.split_once("::").map_or(id.as_str(), |(u, _)| u);
                    let this = PodRef {
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        container: c.name.clone(),
                    };
                    out.entry(uuid.to_owned())
                        .and_modify(|have| {
                            if this < *have {
                                *have = this.clone();
                            }
                        })
                        .or_insert(this);
                }
            }
        }
    }
    out
}

/// Why a `List` call failed.
#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    /// The socket could not be connected.
    #[error("cannot connect to {path}: {source}")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// HTTP/2 failed (handshake, a reset stream, a closed connection).
    #[error("HTTP/2 to the kubelet failed: {0}")]
    Http(#[from] hyper::Error),
    /// The reply was not HTTP 200.
    #[error("the kubelet answered HTTP {0}")]
    Status(StatusCode),
    /// The call ended with a gRPC status other than OK.
    #[error("the kubelet answered gRPC status {code}: {message}")]
    Grpc {
        /// `grpc-status`.
        code: u32,
        /// `grpc-message`, at most 200 bytes of it.
        message: String,
    },
    /// The reply was not one well-formed message.
    #[error("malformed reply: {0}")]
    Malformed(String),
    /// The message did not decode.
    #[error("the reply does not decode as ListPodResourcesResponse: {0}")]
    Decode(#[from] prost::DecodeError),
    /// No reply in time.
    #[error("no reply within {0:?}")]
    Timeout(Duration),
}

/// A client of one kubelet's pod-resources socket, keeping its HTTP/2 connection.
#[derive(Debug)]
pub struct Client {
    socket: PathBuf,
    timeout: Duration,
    /// The connection opened before the agent gave up its capabilities, used first.
    preopened: Option<std::os::unix::net::UnixStream>,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl Client {
    /// A client of `socket`; `preopened` is a connection made earlier, if any.
    pub fn new(
        socket: &Path,
        timeout: Duration,
        preopened: Option<std::os::unix::net::UnixStream>,
    ) -> Client {
        Client {
            socket: socket.to_owned(),
            timeout,
            preopened,
            sender: None,
        }
    }

    async fn connect(&mut self) -> Result<SendRequest<Full<Bytes>>, PodResourcesError> {
        let connect_err = |source| PodResourcesError::Connect {
            path: self.socket.clone(),
            source,
        };
        let stream = match self.preopened.take() {
            Some(s) => {
                s.set_nonblocking(true).map_err(connect_err)?;
                tokio::net::UnixStream::from_std(s).map_err(connect_err)?
            }
            None => tokio::net::UnixStream::connect(&self.socket)
                .await
                .map_err(connect_err)?,
        };
        let (sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "pod-resources connection ended");
            }
        });
        Ok(sender)
    }

    /// Call `List`. A failed call drops the connection; the next call makes a new one.
    pub async fn list(&mut self) -> Result<ListPodResourcesResponse, PodResourcesError> {
        let timeout = self.timeout;
        match tokio::time::timeout(timeout, self.list_once()).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) => {
                self.sender = None;
                Err(e)
            }
            Err(_) => {
                self.sender = None;
                Err(PodResourcesError::Timeout(timeout))
            }
        }
    }

    async fn list_once(&mut self) -> Result<ListPodResourcesResponse, PodResourcesError> {
        let mut sender = match self.sender.take() {
            Some(s) if !s.is_closed() => s,
            _ => self.connect().await?,
        };
        sender.ready().await?;
        // An empty ListPodResourcesRequest: not compressed, zero bytes long.
        let request = Request::builder()
            .method(Method::POST)
            .uri(format!("http://localhost{LIST_PATH}"))
            .header(CONTENT_TYPE, HeaderValue::from_static("application/grpc"))
            .header(TE, HeaderValue::from_static("trailers"))
            .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))
            .map_err(|e| PodResourcesError::Malformed(e.to_string()))?;
        let reply = sender.send_request(request).await?;
        self.sender = Some(sender);
        let (parts, body) = reply.into_parts();
        if parts.status != StatusCode::OK {
            return Err(PodResourcesError::Status(parts.status));
        }
        // A call that fails at once answers with its status in the headers alone.
        grpc_status(&parts.headers)?;
        let collected = Limited::new(body, MAX_REPLY_BYTES + 5)
            .collect()
            .await
            .map_err(|e| match e.downcast::<hyper::Error>() {
                Ok(e) => PodResourcesError::Http(*e),
                Err(e) => PodResourcesError::Malformed(format!(
                    "{e} (more than {MAX_REPLY_BYTES} bytes?)"
                )),
            })?;
        match collected.trailers() {
            Some(t) => grpc_status(t)?,
            None if parts.headers.contains_key("grpc-status") => {}
            None => {
                return Err(PodResourcesError::Malformed(
                    "no grpc-status in the trailers".into(),
                ));
            }
        }
        decode_message(collected.to_bytes())
    }
}

/// `Ok` unless `headers` hold a `grpc-status` other than 0.
fn grpc_status(headers: &HeaderMap) -> Result<(), PodResourcesError> {
    let Some(v) = headers.get("grpc-status") else {
        return Ok(());
    };
    let code = v
        .to_str()
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .ok_or_else(|| PodResourcesError::Malformed(format!("grpc-status {v:?}")))?;
    if code == 0 {
        return Ok(());
    }
    let message = headers
        .get("grpc-message")
        .map(|m| {
            String::from_utf8_lossy(m.as_bytes())
                .chars()
                .take(200)
                .collect()
        })
        .unwrap_or_default();
    Err(PodResourcesError::Grpc { code, message })
}

/// The one length-prefixed message of a unary reply.
fn decode_message(mut body: Bytes) -> Result<ListPodResourcesResponse, PodResourcesError> {
    if body.len() < 5 {
        return Err(PodResourcesError::Malformed(format!(
            "{} bytes, shorter than a message header",
            body.len()
        )));
    }
    let compressed = body.get_u8();
    let len = body.get_u32() as usize;
    if compressed != 0 {
        return Err(PodResourcesError::Malformed(
            "a compressed message, which was not asked for".into(),
        ));
    }
    if len != body.len() {
        return Err(PodResourcesError::Malformed(format!(
            "the message header says {len} bytes, {} followed",
            body.len()
        )));
    }
    Ok(prost::Message::decode(body)?)
}

/// Poll `client` every `interval`, keeping `pods` current, until the task is aborted.
/// Reports itself through `set_up` (`true` after a good reply, `false` after a failed
/// one); a failure keeps the last assignment, since pods outlive a kubelet restart.
pub async fn poll(
    mut client: Client,
    interval: Duration,
    resources: Vec<String>,
    pods: SharedGpuPods,
    set_up: impl Fn(bool) + Send + 'static,
) {
    let mut failing = false;
    loop {
        match client.list().await {
            Ok(reply) => {
                let now = gpu_pods(&reply, &resources);
                let mut held = pods.lock().unwrap_or_else(PoisonError::into_inner);
                if *held != now || failing {
                    tracing::info!(
                        gpus = now.len(),
                        "GPU to pod assignment read from the kubelet"
                    );
                }
                *held = now;
                drop(held);
                set_up(true);
                failing = false;
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(
                        socket = %client.socket.display(),
                        error = %e,
                        "cannot read the kubelet's pod resources; GPU metrics keep their last pod labels"
                    );
                }
                set_up(false);
                failing = true;
            }
        }
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    fn reply() -> ListPodResourcesResponse {
        let dev = |r: &str, ids: &[&str]| ContainerDevices {
            resource_name: r.into(),
            device_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
        };
        let pod = |ns: &str, name: &str, containers: Vec<ContainerResources>| PodResources {
            name: name.into(),
            namespace: ns.into(),
            containers,
        };
        let c = |name: &str, devices| ContainerResources {
            name: name.into(),
            devices,
        };
        ListPodResourcesResponse {
            pod_resources: vec![
                pod(
                    "train",
                    "llama-0",
                    vec![c(
                        "trainer",
                        vec![dev("nvidia.com/gpu", &["GPU-a", "GPU-b"])],
                    )],
                ),
                pod("kube-system", "dns", vec![c("coredns", vec![])]),
                pod(
                    "infer",
                    "vllm-1",
                    vec![c(
                        "engine",
                        vec![dev("nvidia.com/gpu.shared", &["GPU-c::1"])],
                    )],
                ),
                pod(
                    "infer",
                    "vllm-0",
                    vec![c(
                        "engine",
                        vec![dev("nvidia.com/gpu.shared", &["GPU-c::0"])],
                    )],
                ),
                pod(
                    "net",
                    "sriov",
                    vec![c("x", vec![dev("intel.com/sriov", &["0000:3b:00.1"])])],
                ),
            ],
        }
    }

    #[test]
    fn gpus_map_to_their_container_and_a_shared_gpu_to_the_first_in_order() {
        let resources: Vec<String> = DEFAULT_RESOURCES.iter().map(|s| (*s).to_owned()).collect();
        let m = gpu_pods(&reply(), &resources);
        assert_eq!(m.len(), 3, "{m:?}");
        assert_eq!(m["GPU-a"].pod, "llama-0");
        assert_eq!(m["GPU-b"].container, "trainer");
        assert_eq!(m["GPU-c"].pod, "vllm-0", "{m:?}");
        assert!(!m.contains_key("0000:3b:00.1"));
        // Only the resources asked for.
        let m = gpu_pods(&reply(), &["nvidia.com/gpu".to_owned()]);
        assert_eq!(m.keys().collect::<Vec<_>>(), ["GPU-a", "GPU-b"]);
    }

    #[test]
    fn replies_decode_only_as_one_uncompressed_length_prefixed_message() {
        let msg = reply().encode_to_vec();
        let frame = |flag: u8, len: usize, body: &[u8]| {
            let mut v = vec![flag];
            v.extend_from_slice(&u32::try_from(len).expect("len").to_be_bytes());
            v.extend_from_slice(body);
            Bytes::from(v)
        };
        let ok = decode_message(frame(0, msg.len(), &msg)).expect("decodes");
        assert_eq!(ok, reply());
        for bad in [
            frame(1, msg.len(), &msg),
            frame(0, msg.len() + 1, &msg),
            frame(0, msg.len() - 1, &msg),
            Bytes::from_static(&[0, 0]),
        ] {
            assert!(decode_message(bad).is_err());
        }
        // An empty message (no pods) is a valid reply.
        assert_eq!(
            decode_message(frame(0, 0, &[])).expect("empty"),
            ListPodResourcesResponse::default()
        );
    }

    #[test]
    fn a_grpc_status_other_than_ok_is_an_error_with_its_message() {
        let mut h = HeaderMap::new();
        assert!(grpc_status(&h).is_ok());
        h.insert("grpc-status", HeaderValue::from_static("0"));
        assert!(grpc_status(&h).is_ok());
        h.insert("grpc-status", HeaderValue::from_static("7"));
        h.insert(
            "grpc-message",
            HeaderValue::from_static("permission denied"),
        );
        let e = grpc_status(&h).expect_err("status 7");
        assert_eq!(
            e.to_string(),
            "the kubelet answered gRPC status 7: permission denied"
        );
        h.insert("grpc-status", HeaderValue::from_static("x"));
        assert!(matches!(
            grpc_status(&h),
            Err(PodResourcesError::Malformed(_))
        ));
    }
}
