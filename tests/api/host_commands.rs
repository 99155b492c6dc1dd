//! The commands an operator runs on the host beside `aigw serve`: `aigw serve --help` lists the
//! settings, `aigw check` lists every problem without writing anything, a refused resources file
//! leaves nothing behind, and `aigw admin reset-password` recovers a lost password.

use std::io::Write;
use std::path::Path;
use std::process::Stdio;

use serde_json::{Value, json};

use crate::binary::{aigw, free_port, terminate, wait_healthy};

/// The files in `dir`, sorted.
fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort_unstable();
    names
}

#[test]
fn serve_help_lists_every_setting() {
    let dir = tempfile::tempdir().unwrap();
    let out = aigw(dir.path(), &["serve", "--help"], &[]).output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for s in aigw::config::SETTINGS {
        assert!(
            help.contains(s.key) && help.contains(s.env),
            "{} missing:\n{help}",
            s.env
        );
    }
    assert!(help.contains("aigw check"), "{help}");
    let out = aigw(dir.path(), &["serve", "-h"], &[]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("aigw serve --help"));
}

/// A resources file with two problems, each in an entry of its own.
const TWO_PROBLEMS: &str = "[[workspace]]\nname = \"acme\"\n\n[[member]]\nworkspace = \"acme\"\n\
                            email = \"a@acme.test\"\nrole = \"king\"\n\n[[api_key]]\nmember = \
                            \"ghost@acme.test\"\nname = \"ci\"\n";

/// `aigw check` names every problem of the settings file, the variables and the resources file
/// at once and exits 1; with good ones it exits 0. Either way it writes nothing: no database,
/// no secrets file.
#[test]
fn check_lists_every_problem_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("aigw.toml"), "listn = \"127.0.0.1:4000\"\n").unwrap();
    std::fs::write(dir.path().join("bad.toml"), TWO_PROBLEMS).unwrap();
    let good = TWO_PROBLEMS
        .replace("\"king\"", "\"member\"")
        .replace("ghost@", "a@");
    std::fs::write(dir.path().join("good.toml"), good).unwrap();
    let before = files_in(dir.path());

    let out = aigw(
        dir.path(),
        &["check", "--config", "aigw.toml", "--resources", "bad.toml"],
        &[("AIGW_MAX_ATTEMPTS", "abc"), ("AIGW_TIMEZOEN", "UTC")],
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    for needle in [
        "unknown field `listn` (did you mean `listen`?)",
        "max_attempts (AIGW_MAX_ATTEMPTS): \"abc\" is not a whole number",
        "AIGW_TIMEZOEN is not a setting and is ignored (did you mean AIGW_TIMEZONE?)",
        "[[member]] #1 (line 4, \"a@acme.test\"): unknown role \"king\"",
        "[[api_key]] #1 (line 9, \"ghost@acme.test/ci\"): member \"ghost@acme.test\" does not exist",
        "check: 4 problems",
    ] {
        assert!(err.contains(needle), "{needle:?} not in:\n{err}");
    }
    assert!(!err.contains("panicked"), "{err}");

    let out = aigw(dir.path(), &["check", "--resources", "good.toml"], &[])
        .output()
        .unwrap();
    let (stdout, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{err}");
    assert!(stdout.contains("are valid"), "{stdout}");
    assert!(err.contains("does not exist yet"), "{err}");
    assert_eq!(files_in(dir.path()), before, "check wrote nothing");
}

/// A first start refused for its resources file leaves the folder as it was: no database, no
/// generated secrets file, nothing printed on stdout.
#[test]
fn a_refused_resources_file_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bad.toml"), TWO_PROBLEMS).unwrap();
    let out = aigw(
        dir.path(),
        &["serve", "--resources", "bad.toml"],
        &[("AIGW_LISTEN", "127.0.0.1:0")],
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("unknown role") && err.contains("ghost@acme.test"),
        "{err}"
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    assert_eq!(files_in(dir.path()), ["bad.toml"], "no aigw.db, no aigw.keys");
}

/// Signs in; the status and, on success, the token.
async fn sign_in(http: &reqwest::Client, base: &str, password: &str) -> (u16, Option<String>) {
    let r = http
        .post(format!("{base}/admin/v1/auth/login"))
        .json(&json!({"email": "owner@acme.test", "password": password}))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap_or(Value::Null);
    (status, body["token"].as_str().map(str::to_owned))
}

/// `aigw admin reset-password` against the database of a running gateway: the password read
/// from standard input replaces the old one, the member's open session ends, the audit log
/// records it; `--generate` prints one that signs in; a password is never taken from the
/// command line, and an unknown email changes nothing. The start printed the console's URL.
#[test]
fn reset_password_on_the_host_ends_sessions_and_is_audited() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let env = [
        ("AIGW_LISTEN", listen.as_str()),
        ("AIGW_BOOTSTRAP_EMAIL", "owner@acme.test"),
        ("AIGW_BOOTSTRAP_PASSWORD", "lost-password-1"),
    ];
    let mut child = aigw(dir.path(), &["serve"], &env).spawn().unwrap();
    wait_healthy(port, &mut child);
    let base = format!("http://{listen}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let http = reqwest::Client::new();
    let reset = |args: &[&str], stdin: &str| {
        let mut all = vec!["admin", "reset-password"];
        all.extend_from_slice(args);
        let mut cmd = aigw(dir.path(), &all, &[]);
        let mut proc = cmd.stdin(Stdio::piped()).spawn().unwrap();
        proc.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        proc.wait_with_output().unwrap()
    };
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let (status, token) = rt.block_on(sign_in(&http, &base, "lost-password-1"));
        assert_eq!(status, 200);
        let token = token.unwrap();

        let out = reset(&["owner@acme.test"], "found-password-2\n");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!stdout.contains("found-password-2"), "not echoed: {stdout}");
        rt.block_on(async {
            let me = http
                .get(format!("{base}/admin/v1/me"))
                .bearer_auth(&token)
                .send()
                .await
                .unwrap();
            assert_eq!(me.status(), 401, "the open session ended");
            assert_eq!(sign_in(&http, &base, "lost-password-1").await.0, 401);
            let (status, token) = sign_in(&http, &base, "found-password-2").await;
            assert_eq!(status, 200);
            let audit: Value = http
                .get(format!("{base}/admin/v1/audit"))
                .bearer_auth(token.unwrap())
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let text = audit.to_string();
            assert!(
                text.contains("reset_password") && text.contains("aigw admin reset-password (on the host)"),
                "{text}"
            );
        });

        let out = reset(&["owner@acme.test", "--generate"], "");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let generated = stdout
            .lines()
            .find_map(|l| l.strip_prefix("aigw: new password for owner@acme.test: "))
            .unwrap_or_else(|| panic!("{stdout}"))
            .to_owned();
        assert_eq!(rt.block_on(sign_in(&http, &base, &generated)).0, 200);

        for (args, stdin, needle) in [
            (
                &["ghost@acme.test"][..],
                "another-password\n",
                "no member has the email",
            ),
            (&["owner@acme.test"][..], "short\n", "8 to 200 characters"),
            (&["owner@acme.test"][..], "", "no password on standard input"),
        ] {
            let out = reset(args, stdin);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
            assert!(err.contains(needle), "{needle:?} not in {err}");
        }
        let out = reset(&["owner@acme.test", "on-the-command-line"], "");
        assert_eq!(out.status.code(), Some(2), "a password in argv is refused");
        assert_eq!(rt.block_on(sign_in(&http, &base, &generated)).0, 200, "unchanged");
    }));
    let (ok, stdout, err) = terminate(child);
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
    assert!(ok, "{err}");
    assert!(
        stdout.contains(&format!("aigw: console at http://127.0.0.1:{port}/console/")),
        "{stdout}"
    );
}

/// The README's walkthrough cannot meet the gateway of "Getting started": its gateway listens on
/// a port of its own, every URL of the walkthrough uses that port or the mock's, and the wait
/// for the start reads what the started gateway prints (not `/readyz`, which a gateway already
/// on the port would answer) and stops when it has exited (a port taken).
#[test]
fn the_walkthrough_has_a_port_of_its_own() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let start = readme.find("## A 5-minute walkthrough").expect("the walkthrough");
    let section = &readme[start..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
    let port_after = |text: &str, prefix: &str| -> Vec<String> {
        text.match_indices(prefix)
            .map(|(i, _)| {
                text[i + prefix.len()..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect()
            })
            .collect()
    };
    let listen = port_after(section, "AIGW_LISTEN=127.0.0.1:");
    assert!(
        !listen.is_empty() && listen.iter().all(|p| *p == listen[0]),
        "one gateway: {listen:?}"
    );
    let gateway = &listen[0];
    assert_ne!(gateway, "4000", "not the port of Getting started");
    let mock = port_after(section, "mock-upstream --listen 127.0.0.1:");
    assert_eq!(mock.len(), 1);
    let used = port_after(section, "localhost:");
    assert!(used.len() > 5, "{used:?}");
    for port in used {
        assert!(
            port == *gateway || port == mock[0],
            "localhost:{port} in the walkthrough"
        );
    }
    assert!(
        section.contains("kill -0 $!"),
        "the wait stops when the gateway did not start"
    );
    assert!(
        section.contains("until grep -s \"console at\" walkthrough/serve.out"),
        "the wait reads the started gateway's own output, not a port another gateway may hold"
    );
}
