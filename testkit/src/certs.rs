//! Certificates for TLS tests, made with `openssl`: an authority and
//! certificates it signs for 127.0.0.1 and `localhost`, usable by servers
//! and clients alike. `authority(dir, "ca", &["n1"])` writes `ca.pem`,
//! `ca.key`, `n1.pem` and `n1.key` into `dir`.

use std::path::Path;
use std::process::Command;

pub fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl is installed");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// An authority `ca` and, for each name, a certificate for 127.0.0.1 and
/// `localhost`.
pub fn authority(dir: &Path, ca: &str, nodes: &[&str]) {
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    let ca_key = format!("{ca}.key");
    let ca_pem = format!("{ca}.pem");
    let subject = format!("/CN={ca}");
    let mut args = vec!["req", "-x509"];
    args.extend(ec);
    args.extend(["-keyout", &ca_key, "-out", &ca_pem, "-days", "2", "-subj", &subject]);
    openssl(dir, &args);
    std::fs::write(
        dir.join("node.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    for node in nodes {
        let (key, csr, pem, subject) =
            (format!("{node}.key"), format!("{node}.csr"), format!("{node}.pem"), format!("/CN={node}"));
        let mut args = vec!["req"];
        args.extend(ec);
        args.extend(["-keyout", &key, "-out", &csr, "-subj", &subject]);
        openssl(dir, &args);
        openssl(
            dir,
            &["x509", "-req", "-in", &csr, "-CA", &ca_pem, "-CAkey", &ca_key, "-CAcreateserial", "-out", &pem]
                .into_iter()
                .chain(["-days", "2", "-extfile", "node.ext"])
                .collect::<Vec<_>>(),
        );
    }
}
