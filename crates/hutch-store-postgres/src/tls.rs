//! [`DbTls`]: whether nodes speak TLS to the cluster's database, and whom they trust.
//!
//! A URL that names `sslmode=require` (or `prefer`) gets TLS through rustls (the
//! `tokio-postgres-rustls` connector, with the `ring` provider the rest of Hutch uses), and
//! the server's certificate is always verified — chain and name, as libpq's `verify-full` —
//! against the roots of `--cluster-ca FILE` when given, else the system's. A URL without
//! `sslmode`, or with `sslmode=disable`, connects in plain text, as before.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use crate::DbError;

/// How connections to the database are made (see the module docs).
#[derive(Clone, Default)]
pub enum DbTls {
    /// Plain TCP (or a unix socket).
    #[default]
    Plain,
    /// TLS, the server verified with this configuration.
    Verified(Arc<rustls::ClientConfig>),
}

impl std::fmt::Debug for DbTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DbTls::Plain => "Plain",
            DbTls::Verified(_) => "Verified",
        })
    }
}

/// Whether `url` asks for TLS (`sslmode` named and not `disable`), in either URL form.
fn asks_for_tls(url: &str) -> bool {
    let lower = url.to_ascii_lowercase();
    let Some(at) = lower.find("sslmode=") else {
        return false;
    };
    let value: String = lower[at + "sslmode=".len()..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    value != "disable"
}

impl DbTls {
    /// What `url` asks for, trusting the PEM certificates in `ca` (else the system's roots).
    pub fn for_url(url: &str, ca: Option<&Path>) -> Result<Self, DbError> {
        if !asks_for_tls(url) {
            return match ca {
                Some(_) => Err(DbError::Tls(
                    "--cluster-ca is given but the database URL does not ask for TLS: add sslmode=require".into(),
                )),
                None => Ok(Self::Plain),
            };
        }
        let mut roots = rustls::RootCertStore::empty();
        match ca {
            Some(path) => {
                let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                    .and_then(|it| it.collect::<Result<_, _>>())
                    .map_err(|e| DbError::Tls(format!("--cluster-ca {}: {e}", path.display())))?;
                if certs.is_empty() {
                    return Err(DbError::Tls(format!(
                        "--cluster-ca {}: no certificate in it",
                        path.display()
                    )));
                }
                for cert in certs {
                    roots.add(cert).map_err(|e| {
                        DbError::Tls(format!("--cluster-ca {}: {e}", path.display()))
                    })?;
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                for cert in found.certs {
                    let _ = roots.add(cert);
                }
                if roots.is_empty() {
                    return Err(DbError::Tls(
                        "no system root certificates to verify the database with: give --cluster-ca FILE".into(),
                    ));
                }
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| DbError::Tls(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Self::Verified(Arc::new(config)))
    }

    /// The connector for `tokio-postgres`, when TLS.
    pub(crate) fn connector(&self) -> Option<tokio_postgres_rustls::MakeRustlsConnect> {
        match self {
            DbTls::Plain => None,
            DbTls::Verified(c) => {
                Some(tokio_postgres_rustls::MakeRustlsConnect::new((**c).clone()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_only_when_the_url_asks() {
        assert!(!asks_for_tls("postgres://h/db"));
        assert!(!asks_for_tls("postgres://h/db?sslmode=disable"));
        assert!(asks_for_tls("postgres://h/db?sslmode=require"));
        assert!(asks_for_tls("host=h dbname=db sslmode=prefer"));
        assert!(matches!(
            DbTls::for_url("postgres://h/db", Some(Path::new("/x.pem"))),
            Err(DbError::Tls(m)) if m.contains("sslmode=require")
        ));
    }
}
