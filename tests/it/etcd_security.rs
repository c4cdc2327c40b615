//! The etcd store's secrets: credentials from a private file that never reach argv, logs or
//! the cluster, and a cluster over TLS with client certificates. The store's behaviour across
//! hosts is in `etcd.rs`.

use crate::etcd_cluster::Cluster;
use crate::helpers::*;
use std::fs;
use std::path::Path;
use std::process::Command;

use crate::etcd::*;

#[test]
fn credentials_come_from_a_private_file_and_never_reach_argv_logs_or_the_cluster() {
    const PASSWORD: &str = "pw-0f1e2d3c4b5a";
    // Tokens that expire fast, so the run outlives several of them.
    // Info-level member logs say when a token expires.
    let mut cluster = Cluster::start_with(&["--auth-token-ttl", "2", "--log-level", "info"]);
    for args in [
        vec!["user", "add", &format!("root:{PASSWORD}")],
        vec!["role", "add", "root"],
        vec!["user", "grant-role", "root", "root"],
        vec!["auth", "enable"],
    ] {
        let out = cluster.ctl(&args.iter().map(|s| s.as_ref()).collect::<Vec<&str>>());
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    cluster.ctl_flags = vec!["--user".into(), format!("root:{PASSWORD}")];
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("etcd-password");
    fs::write(&pw, format!("{PASSWORD}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&pw, fs::Permissions::from_mode(0o644)).unwrap();
    let a = Env::with_settings(&format!(
        r#"{{"waitpointSweepMs": 300, "host": "a", "store": {{"url": "{}", "leaseTtlS": 2,
            "user": "root", "passwordFile": "{}"}}}}"#,
        cluster.url(),
        pw.display()
    ));
    // A password file others can read is refused, naming the file, not its content.
    let out = a.waitpoint(&["create", "--label", "l", "--intent", "i", "--session", "s1"]);
    a.expect_code("create with an open password file", &out, 1);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("chmod 600") && !said.contains(PASSWORD),
        "{said}"
    );
    fs::set_permissions(&pw, fs::Permissions::from_mode(0o600)).unwrap();

    let (id, secret) = id_secret(&a.arm("train", &["--session", "s1"]));
    let da = a.daemon();
    wait_leading(&a);
    let cmdline = fs::read(format!("/proc/{}/cmdline", da.pid())).unwrap();
    assert!(!String::from_utf8_lossy(&cmdline).contains(PASSWORD));
    // Past a few token lifetimes, each seen to end on the members, the daemon still writes.
    for _ in 0..2 {
        cluster.wait_token_expired();
    }
    a.drop_file("done", &body(&id, &secret, ""));
    a.wait_until("the wake", || a.inbox("s1", "new").len() == 1);

    // A wrong password says so, without either password.
    fs::write(&pw, "not-it\n").unwrap();
    let out = a.waitpoint(&["show", &id]);
    a.expect_code("show with a wrong password", &out, 1);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("authentication failed"), "{said}");
    assert!(
        !said.contains(PASSWORD) && !said.contains("not-it"),
        "{said}"
    );
    assert!(!log(&a).contains(PASSWORD), "{}", log(&a));
    let history = cluster.history();
    assert!(history.contains("t/wp/"), "{history}");
    assert!(!history.contains(PASSWORD));
}

/// A CA, a member certificate for 127.0.0.1 and `etcd.test`, and a client certificate, made
/// with openssl in `dir`.
fn make_certs(dir: &Path) -> crate::etcd_cluster::Tls {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .current_dir(dir)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let mut ca = vec![
        "req",
        "-x509",
        "-days",
        "2",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ];
    ca.extend(ec);
    ca.extend([
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign",
    ]);
    run(&ca);
    for (name, ext) in [
        (
            "server",
            "subjectAltName=IP:127.0.0.1,DNS:etcd.test\nextendedKeyUsage=serverAuth,clientAuth",
        ),
        ("client", "extendedKeyUsage=clientAuth"),
    ] {
        let mut req = vec!["req", "-new", "-subj", "/CN=waitpoint", "-keyout"];
        let (key, csr, pem) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
        );
        req.extend([key.as_str(), "-out", csr.as_str()]);
        req.extend(ec);
        run(&req);
        fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
        let extfile = format!("{name}.ext");
        run(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            &pem,
            "-extfile",
            &extfile,
        ]);
    }
    use std::os::unix::fs::PermissionsExt;
    for f in ["ca.key", "server.key", "client.key"] {
        fs::set_permissions(dir.join(f), fs::Permissions::from_mode(0o600)).unwrap();
    }
    crate::etcd_cluster::Tls {
        ca: dir.join("ca.pem"),
        server_cert: dir.join("server.pem"),
        server_key: dir.join("server.key"),
        client_cert: dir.join("client.pem"),
        client_key: dir.join("client.key"),
    }
}

#[test]
fn a_cluster_over_tls_with_client_certificates_carries_a_round_trip() {
    let certs = tempfile::tempdir().unwrap();
    let tls = make_certs(certs.path());
    let cluster = Cluster::start_tls(&tls);
    let store = |host: &str| {
        format!(
            r#"{{"waitpointSweepMs": 300, "host": "{host}", "store": {{"url": "{}", "leaseTtlS": 2,
                "caFile": "{}", "certFile": "{}", "keyFile": "{}", "tlsDomain": "etcd.test"}}}}"#,
            cluster.url(),
            tls.ca.display(),
            tls.client_cert.display(),
            tls.client_key.display()
        )
    };
    let a = Env::with_settings(&store("a"));
    let b = Env::with_settings(&store("b"));
    // A client key others can read is refused before anything is sent.
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&tls.client_key, fs::Permissions::from_mode(0o644)).unwrap();
    let out = a.waitpoint(&["check", "--session", "s1"]);
    a.expect_code("check with an open client key", &out, 1);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("key file is open to other users"), "{said}");
    fs::set_permissions(&tls.client_key, fs::Permissions::from_mode(0o600)).unwrap();
    let (id, secret) = id_secret(&a.arm("train", &["--session", "s1"]));
    let _da = a.daemon();
    wait_leading(&a);
    let _db = b.daemon();
    b.drop_file("done", &body(&id, &secret, ""));
    a.wait_until("the wake over TLS", || a.inbox("s1", "new").len() == 1);
    let out = a.waitpoint(&["doctor"]);
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(report.contains("3 of 3 members answer"), "{report}");
    // Without the client certificate the cluster does not answer, and the error says where.
    let c = Env::with_settings(&format!(
        r#"{{"host": "c", "store": {{"url": "{}", "caFile": "{}", "tlsDomain": "etcd.test"}}}}"#,
        cluster.url(),
        tls.ca.display()
    ));
    let out = c.waitpoint(&["show", &id]);
    c.expect_code("show without a client certificate", &out, 1);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("etcds://127.0.0.1"), "{said}");
}
