//! Upstreams over TLS with a company's own certificate authority (`upstream_ca_file`), and
//! HTTP/2 as the large providers speak it: the mock's TLS listener offers `h2`.

use aigw::mock_upstream::MockUpstream;
use serde_json::json;

use crate::helpers::{Setup, TestDb, spawn_app, try_spawn_app};
use crate::proxy::KEY;
use crate::upstream::{chat, pool_of};

/// A company's CA and a certificate for `localhost` it signed, written as PEM: (CA, leaf
/// certificate, leaf key).
fn company_ca(db: &TestDb) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "Acme internal CA");
    let ca = ca.self_signed(&ca_key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &ca, &ca_key)
        .unwrap();
    (
        db.write("upstream-ca.pem", &ca.pem()),
        db.write("upstream-cert.pem", &leaf.pem()),
        db.write("upstream-key.pem", &leaf_key.serialize_pem()),
    )
}

/// The mock with a TLS listener, and resources naming it by `https://localhost:PORT/v1`.
async fn tls_mock(db: &TestDb) -> (MockUpstream, String, std::path::PathBuf) {
    let (ca, cert, key) = company_ca(db);
    let mock = MockUpstream::start().await.unwrap();
    let addr = mock
        .serve_tls("127.0.0.1:0".parse().unwrap(), &cert, &key)
        .await
        .unwrap();
    let url = format!("https://localhost:{}/v1", addr.port());
    let resources = pool_of(&[("tls", &url, "cred-tls", r#"["m1"]"#, "")]);
    (mock, resources, ca)
}

/// With the company's CA in `upstream_ca_file`, an upstream whose certificate it signed serves
/// plain and streamed completions; without it, the same upstream is not trusted, never called,
/// and the answer says the TLS handshake failed.
#[tokio::test]
async fn an_upstream_signed_by_an_own_ca_is_trusted_only_with_upstream_ca_file() {
    let db = TestDb::sqlite();
    let (mock, resources, ca) = tls_mock(&db).await;
    let setup = Setup {
        settings: Box::new(move |s| s.upstream_ca_file = Some(ca)),
        ..Setup::resources(resources.clone())
    };
    let app = spawn_app(&db, setup).await;
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let mut streamed = chat("m1");
    streamed["stream"] = json!(true);
    let r = app.post_json("/v1/chat/completions", KEY, &streamed).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert_eq!(mock.call_count(), 2);
    app.stop().await;

    let other = TestDb::sqlite();
    let app = spawn_app(&other, Setup::resources(resources)).await;
    let r = app.post_json("/v1/chat/completions", KEY, &chat("m1")).await;
    assert!(r.status().is_server_error(), "{}", r.status());
    let text = r.text().await.unwrap();
    assert!(
        text.contains("TLS handshake failed (localhost)"),
        "says why: {text}"
    );
    assert_eq!(mock.call_count(), 2, "an untrusted upstream is not called");
    app.stop().await;
}

/// A file that holds no certificate stops the start, naming the setting and the file, before the
/// database is touched.
#[tokio::test]
async fn an_upstream_ca_file_without_a_certificate_stops_the_start() {
    let db = TestDb::sqlite();
    for text in ["", "not a certificate\n"] {
        let path = db.write("bad-ca.pem", text);
        let shown = path.display().to_string();
        let setup = Setup {
            settings: Box::new(move |s| s.upstream_ca_file = Some(path)),
            ..Setup::default()
        };
        let err = match try_spawn_app(&db, setup).await {
            Ok(_) => panic!("started with a CA file of {text:?}"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("upstream_ca_file") && err.contains(&shown), "{err}");
    }
    let missing = db.dir.path().join("missing.pem");
    let setup = Setup {
        settings: Box::new(move |s| s.upstream_ca_file = Some(missing)),
        ..Setup::default()
    };
    let err = try_spawn_app(&db, setup)
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("missing.pem"), "{err}");
    // Refused with the other settings, before the database was opened (or created).
    assert!(!db.dir.path().join("aigw.db").exists(), "the store was opened");
}
