//! TLS on the listeners (`hutch serve --tls-cert --tls-key`): rustls with the ring
//! provider, the same stack the image client uses, so no OpenSSL is linked.
//!
//! The handshake runs in the connection's own task, under the connection table's header
//! timeout (a stranger that never finishes it is evicted like one that never sends a request
//! head). ALPN picks the protocol: `h2` and `http/1.1` on listeners that speak HTTP/2 (the
//! E2B API's), `http/1.1` only on the others (their WebSockets and tunnels are HTTP/1.1
//! upgrades).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Which protocols a TLS listener offers by ALPN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alpn {
    /// `http/1.1` only.
    Http1,
    /// `h2`, then `http/1.1`.
    Http2AndHttp1,
}

/// The certificate chain and private key a server presents, loaded once at start.
#[derive(Clone)]
pub struct TlsIdentity {
    certs: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("TlsIdentity")
            .field("certificates", &self.certs.len())
            .finish_non_exhaustive()
    }
}

/// Errors loading the certificate and key.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate file could not be read or parsed as PEM.
    #[error("reading the TLS certificate chain {path}: {source}")]
    Certificates {
        path: PathBuf,
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    /// The certificate file holds no certificate.
    #[error("{path} holds no PEM certificate (`-----BEGIN CERTIFICATE-----`)")]
    NoCertificate { path: PathBuf },
    /// The key file could not be read or holds no private key.
    #[error("reading the TLS private key {path}: {source}")]
    Key {
        path: PathBuf,
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    /// rustls refused the pair (e.g. the key does not match the certificate).
    #[error("the TLS certificate and key cannot be used together: {0}")]
    Config(#[source] rustls::Error),
}

impl TlsIdentity {
    /// Read a PEM certificate chain (leaf first) and a PEM private key (PKCS#8, PKCS#1 or
    /// SEC1), and check that rustls accepts them.
    pub fn load(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let certs = CertificateDer::pem_file_iter(cert)
            .and_then(|it| it.collect::<Result<Vec<_>, _>>())
            .map_err(|source| TlsError::Certificates {
                path: cert.to_path_buf(),
                source,
            })?;
        if certs.is_empty() {
            return Err(TlsError::NoCertificate {
                path: cert.to_path_buf(),
            });
        }
        let key = PrivateKeyDer::from_pem_file(key).map_err(|source| TlsError::Key {
            path: key.to_path_buf(),
            source,
        })?;
        let identity = Self {
            certs,
            key: Arc::new(key),
        };
        // A mismatched pair fails here, at start, not at the first handshake.
        identity.server_config(Alpn::Http1)?;
        Ok(identity)
    }

    /// A rustls server configuration for a listener offering `alpn`.
    pub fn server_config(&self, alpn: Alpn) -> Result<Arc<ServerConfig>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Config)?
            .with_no_client_auth()
            .with_single_cert(self.certs.clone(), self.key.clone_key())
            .map_err(TlsError::Config)?;
        config.alpn_protocols = match alpn {
            Alpn::Http1 => vec![b"http/1.1".to_vec()],
            Alpn::Http2AndHttp1 => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        };
        Ok(Arc::new(config))
    }

    /// The acceptor of a listener offering `alpn`.
    pub fn acceptor(&self, alpn: Alpn) -> Result<tokio_rustls::TlsAcceptor, TlsError> {
        Ok(tokio_rustls::TlsAcceptor::from(self.server_config(alpn)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_without_a_certificate_is_named_in_the_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cert = dir.path().join("cert.pem");
        let key = dir.path().join("key.pem");
        std::fs::write(&cert, "not a certificate\n").expect("write");
        std::fs::write(&key, "not a key\n").expect("write");
        let err = TlsIdentity::load(&cert, &key).expect_err("no certificate");
        assert!(
            matches!(&err, TlsError::NoCertificate { path } if path == &cert),
            "{err}"
        );
        assert!(err.to_string().contains("cert.pem"), "{err}");
    }
}
