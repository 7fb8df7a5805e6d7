//! A certificate authority of the test's own, made with the `openssl` command, and a server
//! certificate it signed for `127.0.0.1`, `localhost` and the E2B API's sandbox host names:
//! what `hutch serve --tls-cert --tls-key` needs, and the root its clients must trust.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A CA and a leaf certificate in a temporary directory (removed when dropped).
pub struct TestCa {
    dir: tempfile::TempDir,
}

impl TestCa {
    /// Make a CA (`ca.pem`) and a server certificate (`cert.pem`, `key.pem`) it signed.
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("hutch-test-ca-")
            .tempdir()
            .expect("tempdir");
        let d = dir.path();
        std::fs::write(
            d.join("leaf.ext"),
            "subjectAltName = IP:127.0.0.1, DNS:localhost, DNS:*.localhost, DNS:*.e2b.localhost\n\
             basicConstraints = CA:FALSE\n\
             keyUsage = digitalSignature, keyEncipherment\n\
             extendedKeyUsage = serverAuth\n",
        )
        .expect("write leaf.ext");
        openssl(
            d,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=hutch test CA",
            ],
        );
        openssl(
            d,
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                "key.pem",
                "-out",
                "leaf.csr",
                "-subj",
                "/CN=127.0.0.1",
            ],
        );
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                "leaf.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "cert.pem",
                "-days",
                "2",
                "-extfile",
                "leaf.ext",
            ],
        );
        Self { dir }
    }

    /// The server certificate (`--tls-cert`).
    pub fn cert(&self) -> PathBuf {
        self.dir.path().join("cert.pem")
    }

    /// Its private key (`--tls-key`).
    pub fn key(&self) -> PathBuf {
        self.dir.path().join("key.pem")
    }

    /// The CA's certificate, for clients to trust (`SSL_CERT_FILE`, `NODE_EXTRA_CA_CERTS`).
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The CA's certificate as PEM bytes.
    pub fn root_pem(&self) -> Vec<u8> {
        std::fs::read(self.root()).expect("read ca.pem")
    }

    /// The `hutch serve` flags that serve TLS with this certificate.
    pub fn serve_args(&self) -> Vec<String> {
        vec![
            "--tls-cert".into(),
            path_text(&self.cert()),
            "--tls-key".into(),
            path_text(&self.key()),
        ]
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

fn path_text(p: &Path) -> String {
    p.to_str().expect("utf-8 path").to_string()
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl (scripts/deps.sh installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
