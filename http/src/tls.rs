//! TLS client settings: rustls with the ring provider, trusting the public (Mozilla)
//! roots and, when given, the CA certificates of a PEM file (a private CA).

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// Why the TLS client settings could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The CA file could not be read or holds no usable certificate.
    #[error("CA file {path}: {detail}")]
    CaFile {
        /// The file.
        path: String,
        /// What is wrong with it.
        detail: String,
    },
    /// rustls refused the settings.
    #[error("TLS setup: {0}")]
    Config(#[from] rustls::Error),
}

/// A TLS client configuration trusting the public (Mozilla) roots and the CA
/// certificates in `ca_file`, when given.
pub fn client_config(ca_file: Option<&Path>) -> Result<rustls::ClientConfig, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = ca_file {
        let bad = |detail: String| TlsError::CaFile {
            path: path.display().to_string(),
            detail,
        };
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .map_err(|e| bad(e.to_string()))?
            .collect::<Result<_, _>>()
            .map_err(|e| bad(e.to_string()))?;
        if certs.is_empty() {
            return Err(bad("no CERTIFICATE block".into()));
        }
        for c in certs {
            roots.add(c)?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_public_roots_by_default_and_a_bad_ca_file_is_named() {
        assert!(client_config(None).is_ok());
        let missing = Path::new("/nonexistent/warden-ca.pem");
        let err = client_config(Some(missing)).expect_err("no such file");
        assert!(
            err.to_string().contains("/nonexistent/warden-ca.pem"),
            "{err}"
        );
        let dir = std::env::temp_dir().join(format!("warden-http-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").expect("write");
        let err = client_config(Some(&empty)).expect_err("no certificate");
        assert!(err.to_string().contains("no CERTIFICATE block"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
