//! The `aigw` binary as an operator runs it: no settings, bad settings, signals, secrets in output.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_aigw");

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub(crate) fn aigw(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// Waits until `/healthz` answers on `port`, or panics after 30 s.
pub(crate) fn wait_healthy(port: u16, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            panic!("aigw exited early with {status}: {err}");
        }
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            use std::io::Write;
            let _ = s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            let mut resp = String::new();
            let _ = s.read_to_string(&mut resp);
            if resp.starts_with("HTTP/1.1 200") {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("aigw did not become healthy on port {port}");
}

/// Sends SIGTERM and returns (exit success, stdout, stderr).
pub(crate) fn terminate(child: Child) -> (bool, String, String) {
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn serve_with_no_settings_runs_on_sqlite_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut child = aigw(dir.path(), &["serve"], &[("AIGW_LISTEN", &listen)])
        .spawn()
        .unwrap();
    wait_healthy(port, &mut child);
    assert!(
        dir.path().join("aigw.db").exists(),
        "aigw.db created in the working directory"
    );
    let keys = dir.path().join("aigw.keys");
    assert!(keys.exists(), "generated secrets file");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&keys).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
    let (ok, out, err) = terminate(child);
    assert!(ok, "clean exit on SIGTERM: {err}");
    assert!(
        out.contains("password: "),
        "generated owner password printed once: {out}"
    );
    assert!(err.contains("aigw stopped"), "{err}");
    assert!(!err.contains("panicked"));

    // Second start: same database, no new owner, no password printed.
    let mut child = aigw(dir.path(), &["serve"], &[("AIGW_LISTEN", &listen)])
        .spawn()
        .unwrap();
    wait_healthy(port, &mut child);
    let (ok, out, _) = terminate(child);
    assert!(ok);
    assert!(
        !out.contains("password"),
        "printed only on the first start: {out}"
    );
}

/// Signs in, sets and replaces an upstream secret, creates a key and changes the password, all
/// at debug log level; returns every secret that passed through, none of which may be printed.
fn through_the_admin_api(port: u16) -> Vec<String> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let base = format!("http://127.0.0.1:{port}/admin/v1");
        let http = reqwest::Client::new();
        let login: serde_json::Value = http
            .post(format!("{base}/auth/login"))
            .json(&serde_json::json!({"email": "a@acme.test", "password": "owner-pw-123456"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let token = login["token"].as_str().unwrap().to_owned();
        let (first, second) = ("sk-admin-set-secret-71c3a9", "sk-admin-replaced-secret-0d5e");
        let created: serde_json::Value = http
            .post(format!("{base}/upstreams"))
            .bearer_auth(&token)
            .json(&serde_json::json!({"name": "via-api", "provider": "openai", "api_key": first, "models": ["m"]}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let id = created["id"].as_i64().unwrap();
        let r = http
            .patch(format!("{base}/upstreams/{id}"))
            .bearer_auth(&token)
            .json(&serde_json::json!({"api_key": second}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let key: serde_json::Value = http
            .post(format!("{base}/keys"))
            .bearer_auth(&token)
            .json(&serde_json::json!({"name": "made-here"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let plaintext = key["key"].as_str().unwrap().to_owned();
        let r = http
            .post(format!("{base}/auth/password"))
            .bearer_auth(&token)
            .json(&serde_json::json!({"current_password": "owner-pw-123456", "new_password": "owner-pw-654321"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        vec![first.into(), second.into(), plaintext, token, "owner-pw-654321".into()]
    })
}

#[test]
fn secrets_never_reach_output_or_database() {
    let dir = tempfile::tempdir().unwrap();
    let secret = "sk-upstream-binary-secret-9e8d7c";
    let resources = dir.path().join("resources.toml");
    std::fs::write(
        &resources,
        "[[workspace]]\nname = \"acme\"\n[[member]]\nworkspace = \"acme\"\nemail = \"a@acme.test\"\nrole = \"owner\"\n\
         password = \"${OWNER_PW}\"\n[[api_key]]\nmember = \"a@acme.test\"\nname = \"gen\"\n\
         [[upstream]]\nworkspace = \"acme\"\nname = \"u\"\nprovider = \"openai\"\napi_key = \"${UPSTREAM_KEY}\"\nmodels = [\"m\"]\n",
    )
    .unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let env = [
        ("AIGW_LISTEN", listen.as_str()),
        ("UPSTREAM_KEY", secret),
        ("OWNER_PW", "owner-pw-123456"),
        ("AIGW_LOG", "debug"),
    ];
    let mut child = aigw(dir.path(), &["serve", "--resources", "resources.toml"], &env)
        .spawn()
        .unwrap();
    wait_healthy(port, &mut child);
    let admin_secrets = through_the_admin_api(port);
    let (ok, out, err) = terminate(child);
    assert!(ok, "{err}");
    // The generated master key and JWT secret live in aigw.keys, and nowhere else.
    let keys_file = std::fs::read_to_string(dir.path().join("aigw.keys")).unwrap();
    let generated_secrets: Vec<String> = keys_file
        .lines()
        .filter_map(|l| {
            l.split_once('=')
                .map(|(_, v)| v.trim().trim_matches('"').to_owned())
        })
        .filter(|v| v.len() >= 16)
        .collect();
    assert!(!generated_secrets.is_empty(), "{keys_file}");
    for text in [&out, &err] {
        for s in admin_secrets.iter().chain(&generated_secrets) {
            assert!(!text.contains(s.as_str()), "a secret reached the output: {s}");
        }
    }
    let generated = out
        .lines()
        .find_map(|l| l.split("generated API key a@acme.test/gen: ").nth(1))
        .expect("generated key printed once")
        .trim()
        .to_owned();
    assert!(aigw::kernel::crypto::is_api_key_shape(&generated));
    for text in [&out, &err] {
        assert!(!text.contains(secret), "upstream secret in output");
        assert!(!text.contains("owner-pw-123456"), "password in output");
    }
    assert!(!err.contains(&generated), "generated key in the logs");
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with("aigw.db") {
            let hay = String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned();
            assert!(!hay.contains(secret), "upstream secret in {name}");
            assert!(!hay.contains(&generated), "gateway key in {name}");
        }
    }
    // Restart with the same file: the key is not generated again.
    let mut child = aigw(dir.path(), &["serve", "--resources", "resources.toml"], &env)
        .spawn()
        .unwrap();
    wait_healthy(port, &mut child);
    let (ok, out, _) = terminate(child);
    assert!(ok);
    assert!(!out.contains("generated API key"), "{out}");
}

#[test]
fn bad_settings_and_files_exit_nonzero_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bad.toml"),
        "listen = \"127.0.0.1:1\"\nmystery = 1\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("bad-res.toml"),
        "[[api_key]]\nmember = \"ghost@x.test\"\nname = \"k\"\n",
    )
    .unwrap();
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case] = &[
        (&["serve"], &[("AIGW_LISTEN", "not-an-address")], "AIGW_LISTEN"),
        (&["serve"], &[("AIGW_TIMEZONE", "Mars/Base")], "AIGW_TIMEZONE"),
        (
            &["serve"],
            &[("AIGW_MAX_BODY_BYTES", "lots")],
            "AIGW_MAX_BODY_BYTES",
        ),
        (
            &["serve"],
            &[("AIGW_MASTER_KEY", "too-short"), ("AIGW_JWT_SECRET", "x")],
            "master_key",
        ),
        (&["serve", "--config", "bad.toml"], &[], "unknown field `mystery`"),
        (
            &["serve", "--config", "missing.toml"],
            &[],
            "cannot read config file",
        ),
        (
            &["serve", "--resources", "bad-res.toml"],
            &[("AIGW_LISTEN", "127.0.0.1:0")],
            "member \"ghost@x.test\" does not exist",
        ),
        (
            &["serve"],
            &[("AIGW_DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")],
            "cannot open the database",
        ),
    ];
    for (args, env, needle) in cases {
        // A free port unless the case sets its own: the listener is bound first, and whatever
        // else runs on this machine may hold the default one.
        let env: Vec<(&str, &str)> = [("AIGW_LISTEN", "127.0.0.1:0")]
            .into_iter()
            .chain(env.iter().copied())
            .collect();
        let out = aigw(dir.path(), args, &env).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?} {env:?}: {err}");
        assert!(
            err.contains(needle),
            "{args:?} {env:?}: {err:?} should name {needle:?}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// Three `aigw serve` on one Postgres schema, in one folder, with the same resources file and no
/// configured secrets, started at the same instant (as a deployment of three replicas does): all
/// come up, one owner and one generated key are created and printed, one secrets file is shared.
#[test]
fn three_binaries_started_together_on_postgres_all_come_up() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(db) = rt.block_on(crate::helpers::TestDb::postgres()) else {
        return;
    };
    db.write("resources.toml", crate::startup::REPLICA_RESOURCES);
    let ports = [free_port(), free_port(), free_port()];
    let mut children: Vec<Child> = ports
        .iter()
        .map(|port| {
            let listen = format!("127.0.0.1:{port}");
            aigw(
                db.dir.path(),
                &["serve", "--resources", "resources.toml"],
                &[("AIGW_LISTEN", &listen), ("AIGW_DATABASE_URL", &db.url)],
            )
            .spawn()
            .unwrap()
        })
        .collect();
    for (port, child) in ports.iter().zip(&mut children) {
        wait_healthy(*port, child);
    }
    let outputs: Vec<String> = children
        .into_iter()
        .map(|child| {
            let (ok, out, err) = terminate(child);
            assert!(ok, "{err}");
            out
        })
        .collect();
    let printed = |what: &str| outputs.iter().filter(|o| o.contains(what)).count();
    assert_eq!(printed("password: "), 1, "one owner created: {outputs:?}");
    assert_eq!(
        printed("generated API key ada@acme.test/generated"),
        1,
        "one key generated: {outputs:?}"
    );
    assert!(db.dir.path().join("aigw.keys").exists());
}

/// With the port taken, `serve` stops before it creates a database, secrets, an owner or keys.
#[test]
fn a_taken_port_exits_before_touching_the_database() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("resources.toml"),
        crate::startup::REPLICA_RESOURCES,
    )
    .unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = taken.local_addr().unwrap().to_string();
    let out = aigw(
        dir.path(),
        &["serve", "--resources", "resources.toml"],
        &[("AIGW_LISTEN", &listen)],
    )
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains(&format!("cannot listen on {listen}")), "{stderr}");
    assert_eq!(stdout, "", "no password or key printed");
    let mut left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort_unstable();
    assert_eq!(left, ["resources.toml"], "no database, no secrets file");
}

/// A start that ignores something the operator set says so: bootstrap settings on a database
/// that already has an owner, and an `AIGW_*` variable aigw does not read (a typo). Variables
/// aigw does read, and those of the repository's tests, are not warned about.
#[test]
fn ignored_bootstrap_settings_and_unknown_variables_are_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let first = [
        ("AIGW_LISTEN", listen.as_str()),
        ("AIGW_BOOTSTRAP_EMAIL", "first@example.test"),
        ("AIGW_BOOTSTRAP_PASSWORD", "first-password"),
        ("AIGW_LOG", "info"),
        ("AIGW_TEST_POSTGRES_URL", "postgres://nowhere"),
    ];
    let mut child = aigw(dir.path(), &["serve"], &first).spawn().unwrap();
    wait_healthy(port, &mut child);
    let (ok, _, err) = terminate(child);
    assert!(ok, "{err}");
    assert!(
        !err.contains("ignored"),
        "nothing ignored on the first start: {err}"
    );
    assert!(
        !err.contains("unknown"),
        "known variables are not warned about: {err}"
    );

    // Same owner again: nothing to warn about.
    let mut child = aigw(dir.path(), &["serve"], &first).spawn().unwrap();
    wait_healthy(port, &mut child);
    let (ok, _, err) = terminate(child);
    assert!(ok, "{err}");
    assert!(!err.contains("ignored"), "the bootstrap owner exists: {err}");

    let mut child = aigw(
        dir.path(),
        &["serve"],
        &[
            ("AIGW_LISTEN", listen.as_str()),
            ("AIGW_BOOTSTRAP_EMAIL", "second@example.test"),
            ("AIGW_BOOTSTRAP_PASSWORD", "second-password"),
            ("AIGW_MAX_ATTEMTPS", "5"),
        ],
    )
    .spawn()
    .unwrap();
    wait_healthy(port, &mut child);
    let (ok, _, err) = terminate(child);
    assert!(ok, "{err}");
    assert!(
        err.contains("AIGW_BOOTSTRAP_EMAIL")
            && err.contains("are ignored")
            && err.contains("second@example.test"),
        "ignored bootstrap settings are named: {err}"
    );
    assert!(
        err.contains("unknown AIGW_*") && err.contains("AIGW_MAX_ATTEMTPS"),
        "{err}"
    );
}

/// The README walkthrough, steps 1–4, as written, with the mock on another port through
/// `MOCK_PORT`: the example key answers, a scripted 429 on `gpt-4o-mini` fails over to `fast` on
/// the second credential, a 429 on every model comes back as is, and the request after it is the
/// gateway's own `upstream_quota_exhausted`.
#[test]
fn the_readme_walkthrough_works_with_the_mock_on_another_port() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("walkthrough")).unwrap();
    let mock_port = free_port();
    let mock_listen = format!("127.0.0.1:{mock_port}");
    let mut mock = aigw(dir.path(), &["mock-upstream", "--listen", &mock_listen], &[])
        .spawn()
        .unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let resources = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/resources.toml");
    let mock_port_text = mock_port.to_string();
    let mut child = aigw(
        dir.path(),
        &["serve", "--resources", resources],
        &[
            ("AIGW_LISTEN", listen.as_str()),
            ("MOCK_PORT", mock_port_text.as_str()),
            ("ADA_PASSWORD", "ada-demo-password"),
            ("MOCK_UPSTREAM_KEY", "mock-key"),
            ("AIGW_DATABASE_URL", "sqlite://walkthrough/aigw.db"),
            ("AIGW_BOOTSTRAP_EMAIL", "owner@acme.test"),
            ("AIGW_BOOTSTRAP_PASSWORD", "owner-password"),
        ],
    )
    .spawn()
    .unwrap();
    wait_healthy(port, &mut child);
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Caught so that a failed step still stops both processes.
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rt.block_on(async {
        let http = reqwest::Client::new();
        let gw = format!("http://{listen}");
        let mock_url = format!("http://{mock_listen}");
        let login = http
            .post(format!("{gw}/admin/v1/auth/login"))
            .json(&serde_json::json!({"email": "owner@acme.test", "password": "owner-password"}))
            .send()
            .await
            .unwrap();
        assert_eq!(login.status(), 200, "the bootstrap owner signs in");
        let chat = || async {
            let r = http
                .post(format!("{gw}/v1/chat/completions"))
                .bearer_auth("sk-aigw-DemoKey0123456789abcdefghijKLMNO")
                .json(&serde_json::json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Say hello"}]}))
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let source = r
                .headers()
                .get("x-aigw-error-source")
                .map(|v| v.to_str().unwrap().to_owned());
            let body: serde_json::Value = r.json().await.unwrap();
            (status, source, body)
        };
        let script = |model: Option<&str>| {
            let mut s = serde_json::json!({"status": 429, "headers": {"retry-after": "120"},
                "body": {"error": {"message": "Rate limit exceeded", "type": "rate_limit_error"}}});
            if let Some(m) = model {
                s["model"] = m.into();
            }
            http.post(format!("{mock_url}/__mock/script")).json(&s).send()
        };
        let (status, _, body) = chat().await;
        assert_eq!(status, 200, "step 3: {body}");
        assert_eq!(body["model"], "gpt-4o-mini");

        script(Some("gpt-4o-mini")).await.unwrap();
        let (status, _, body) = chat().await;
        assert_eq!((status, &body["model"]), (200, &"gpt-4.1-nano".into()), "fails over to fast: {body}");

        script(None).await.unwrap();
        let (status, source, body) = chat().await;
        assert_eq!((status, source.as_deref()), (429, Some("upstream")), "{body}");
        let (status, source, body) = chat().await;
        assert_eq!((status, source.as_deref()), (429, Some("gateway")), "{body}");
        assert_eq!(body["error"]["code"], "upstream_quota_exhausted");
        })
    }));
    let (ok, _, err) = terminate(child);
    mock.kill().unwrap();
    let _ = mock.wait();
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
    assert!(ok, "{err}");
    assert!(!err.contains("are ignored"), "a database of its own: {err}");
}
