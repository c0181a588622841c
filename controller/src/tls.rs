//! HTTPS for the controller's API (rustls, ring): a certificate chain and key from PEM
//! files, and the TLS handshake `warden_http::server` runs on every accepted connection.
//! Each handshake runs in its connection's own task with a deadline, so a slow or silent
//! client never holds up the others, and counts against the connection cap.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// How long a client gets to finish its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// TLS settings of the API (config section `tls`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM file with the server certificate, then its intermediates.
    pub cert_file: PathBuf,
    /// PEM file with the private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// PEM file with CA certificates to trust beside the public roots when this
    /// controller relays to the leader over https (a private CA).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
}

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or holds nothing usable.
    #[error("{what} {path}: {detail}")]
    Pem {
        /// `certificate file` or `key file`.
        what: &'static str,
        /// The file.
        path: String,
        /// What is wrong.
        detail: String,
    },
    /// rustls refused the certificate and key.
    #[error("the certificate and key do not make a TLS server: {0}")]
    Config(#[from] rustls::Error),
}

/// The rustls server configuration for `cfg`.
pub fn server_config(cfg: &TlsConfig) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let pem = |what, path: &Path, detail: String| TlsError::Pem {
        what,
        path: path.display().to_string(),
        detail,
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cfg.cert_file)
        .map_err(|e| pem("certificate file", &cfg.cert_file, e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| pem("certificate file", &cfg.cert_file, e.to_string()))?;
    if certs.is_empty() {
        return Err(pem(
            "certificate file",
            &cfg.cert_file,
            "no CERTIFICATE block".into(),
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&cfg.key_file)
        .map_err(|e| pem("key file", &cfg.key_file, e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A TLS client configuration trusting the public (Mozilla) roots and the CA
/// certificates in `ca_file`, when given (warden-http's, with this module's errors).
pub fn client_config(ca_file: Option<&Path>) -> Result<rustls::ClientConfig, TlsError> {
    warden_http::tls::client_config(ca_file).map_err(|e| match e {
        warden_http::tls::TlsError::CaFile { path, detail } => TlsError::Pem {
            what: "CA file",
            path,
            detail,
        },
        warden_http::tls::TlsError::Config(e) => TlsError::Config(e),
    })
}

/// The TLS handshake of the API's connections, run by `warden_http::server` on each
/// accepted connection inside its slot: a handshake in progress counts against the
/// connection cap, is evicted like any idle connection, and has at most
/// [`HANDSHAKE_TIMEOUT`] (and no more than the server's header timeout).
#[derive(Clone)]
pub struct TlsHandshake {
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for TlsHandshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsHandshake").finish_non_exhaustive()
    }
}

impl TlsHandshake {
    /// Serve TLS with `config`.
    pub fn new(config: Arc<rustls::ServerConfig>) -> Self {
        TlsHandshake {
            acceptor: TlsAcceptor::from(config),
        }
    }
}

impl warden_http::server::Handshake for TlsHandshake {
    type Io = TlsStream<TcpStream>;

    async fn handshake(&self, tcp: TcpStream) -> std::io::Result<Self::Io> {
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, self.acceptor.accept(tcp)).await {
            Ok(done) => done,
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "TLS handshake timed out",
            )),
        }
    }
}
