//! Warden's one HTTP client and its one retry backoff.
//!
//! Every outgoing HTTP request of Warden (the LLM client, incident alerts, the `warden`
//! CLI, the agent's shipping, a follower controller's relay, the controller's log
//! fetches from agents, trace export) goes through [`HttpClient`] or its [`Connector`]:
//! hyper 1 over rustls (the ring provider; the Mozilla roots unless the caller gives
//! its own [`rustls::ClientConfig`]), a connect timeout, answers read up to a bound,
//! and proxies taken from `HTTPS_PROXY`, `HTTP_PROXY` and `NO_PROXY` ([`Proxies`]).
//! Retries wait as [`Backoff`] says.
//!
//! Every HTTP server of Warden (the controller's API, plain or TLS, and the agent's
//! local API) is [`server::Server`]: HTTP/1.1 only, with a header timeout, an idle
//! timeout and a connection cap with per-peer fairness.

pub mod backoff;
mod client;
pub mod ingest;
pub mod proxy;
pub mod server;
pub mod tls;

pub use backoff::Backoff;
pub use client::{
    Builder, Connector, Error, HttpClient, HttpResponse, MAX_RESPONSE_BYTES, error_chain, origin,
};
pub use proxy::Proxies;
