//! Single sign-on for the console (issue 26): the OpenID Connect authorization-code flow with
//! PKCE against a small provider started here, driven through HTTP as a browser would (start →
//! provider → callback with the cookie). Groups map to a workspace and role; the first sign-in
//! creates the member, later ones follow the groups, no mapped group refuses and revokes; forged,
//! replayed and expired sign-ins are refused; keys rotate; passwords can be turned off.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aigw::config::sso::SsoGroup;
use aigw::kernel::clock::Clock;
use axum::extract::{Form, Query};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::both_backends;
use crate::helpers::{Setup, TestApp, TestDb, spawn_app};
use crate::proxy::fixture;

const CLIENT_ID: &str = "aigw-console";
const CLIENT_SECRET: &str = "s3cret&=";
/// The redirect URI registered at the provider; the test's browser maps it to the gateway.
const PUBLIC: &str = "http://aigw.test";
const OWNER: &str = "owner@example.test";
const OWNER_PASSWORD: &str = "owner-password";

/// One signing key of the provider.
struct Key {
    kid: String,
    encoding: EncodingKey,
    jwk: Value,
}

impl Key {
    fn generate(kid: &str) -> Key {
        let pair = rcgen::KeyPair::generate().unwrap();
        let raw = pair.public_key_raw();
        assert_eq!(raw.len(), 65, "an uncompressed P-256 point");
        Key {
            kid: kid.to_owned(),
            encoding: EncodingKey::from_ec_der(pair.serialized_der()),
            jwk: json!({"kty": "EC", "crv": "P-256", "kid": kid, "alg": "ES256", "use": "sig",
                "x": URL_SAFE_NO_PAD.encode(&raw[1..33]), "y": URL_SAFE_NO_PAD.encode(&raw[33..])}),
        }
    }
}

/// What the next ID token gets wrong, if anything.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Tamper {
    None,
    Nonce,
    Audience,
    /// `iss` with a trailing `/` the provider's issuer does not have.
    IssuerSlash,
    Expired,
    /// Signed with a key the provider does not publish.
    ForeignKey,
    /// HS256 with the client secret.
    Hmac,
}

struct ProviderState {
    url: String,
    keys: Vec<Key>,
    /// The key that signs.
    signing: usize,
    /// How many keys the JWKS publishes (the first n).
    published: usize,
    user: (String, Vec<String>),
    codes: HashMap<String, (String, String, String)>,
    tamper: Tamper,
    clock: Option<Clock>,
    jwks_fetches: usize,
    /// Bytes of padding the JWKS carries (a provider that answers absurdly much).
    jwks_padding: usize,
    /// The issuer the discovery document names, when not the provider's own URL.
    discovery_issuer: Option<String>,
    /// The ID token's `email_verified` claim.
    email_verified: Value,
}

/// A small OpenID provider: discovery, authorize (signs in `user` at once), token (checks the
/// client, the redirect URI and PKCE), JWKS.
#[derive(Clone)]
struct Provider(Arc<Mutex<ProviderState>>);

impl Provider {
    async fn start() -> Provider {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let p = Provider(Arc::new(Mutex::new(ProviderState {
            url,
            keys: vec![Key::generate("k1"), Key::generate("k2"), Key::generate("foreign")],
            signing: 0,
            published: 1,
            user: ("carol@acme.test".into(), vec![]),
            codes: HashMap::new(),
            tamper: Tamper::None,
            clock: None,
            jwks_fetches: 0,
            jwks_padding: 0,
            discovery_issuer: None,
            email_verified: json!(true),
        })));
        let (a, b, c, d) = (p.clone(), p.clone(), p.clone(), p.clone());
        let app = axum::Router::new()
            .route(
                "/.well-known/openid-configuration",
                axum::routing::get(move || async move { axum::Json(a.discovery()) }),
            )
            .route(
                "/authorize",
                axum::routing::get(
                    move |Query(q): Query<HashMap<String, String>>| async move { b.authorize(&q) },
                ),
            )
            .route(
                "/token",
                axum::routing::post(
                    move |headers: HeaderMap, Form(f): Form<HashMap<String, String>>| async move {
                        c.token(&headers, &f)
                    },
                ),
            )
            .route(
                "/jwks",
                axum::routing::get(move || async move {
                    let mut st = d.0.lock().unwrap();
                    st.jwks_fetches += 1;
                    let keys: Vec<Value> = st.keys[..st.published].iter().map(|k| k.jwk.clone()).collect();
                    axum::Json(json!({ "keys": keys, "padding": "x".repeat(st.jwks_padding) }))
                }),
            );
        tokio::spawn(async move { axum::serve(listener, app).await });
        p
    }

    fn url(&self) -> String {
        self.0.lock().unwrap().url.clone()
    }

    fn with<R>(&self, f: impl FnOnce(&mut ProviderState) -> R) -> R {
        f(&mut self.0.lock().unwrap())
    }

    fn discovery(&self) -> Value {
        let url = self.url();
        let issuer = self
            .with(|st| st.discovery_issuer.clone())
            .unwrap_or_else(|| url.clone());
        json!({"issuer": issuer, "authorization_endpoint": format!("{url}/authorize"),
            "token_endpoint": format!("{url}/token"), "jwks_uri": format!("{url}/jwks"),
            "response_types_supported": ["code"], "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["ES256"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic"]})
    }

    fn authorize(&self, q: &HashMap<String, String>) -> axum::response::Response {
        let get = |k: &str| q.get(k).cloned().unwrap_or_default();
        if get("response_type") != "code"
            || get("client_id") != CLIENT_ID
            || get("code_challenge_method") != "S256"
        {
            return (StatusCode::BAD_REQUEST, "bad authorization request").into_response();
        }
        assert!(get("scope").split(' ').any(|s| s == "openid"));
        let code = format!("code-{}", rand::random::<u64>());
        self.with(|st| {
            st.codes.insert(
                code.clone(),
                (get("nonce"), get("code_challenge"), get("redirect_uri")),
            )
        });
        let to = format!("{}?code={code}&state={}", get("redirect_uri"), get("state"));
        (StatusCode::FOUND, [(header::LOCATION, to)]).into_response()
    }

    fn token(&self, headers: &HeaderMap, f: &HashMap<String, String>) -> axum::response::Response {
        let refuse = |e: &str| (StatusCode::BAD_REQUEST, axum::Json(json!({"error": e}))).into_response();
        // client_secret_basic, form-encoded before base64 (RFC 6749 §2.3.1).
        let basic = format!("Basic {}", STANDARD.encode(format!("{CLIENT_ID}:s3cret%26%3D")));
        if headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) != Some(basic.as_str()) {
            return (
                StatusCode::UNAUTHORIZED,
                axum::Json(json!({"error": "invalid_client"})),
            )
                .into_response();
        }
        let get = |k: &str| f.get(k).cloned().unwrap_or_default();
        let mut st = self.0.lock().unwrap();
        // A code works once.
        let Some((nonce, challenge, redirect)) = st.codes.remove(&get("code")) else {
            return refuse("invalid_grant");
        };
        if get("redirect_uri") != redirect || get("grant_type") != "authorization_code" {
            return refuse("invalid_grant");
        }
        if URL_SAFE_NO_PAD.encode(Sha256::digest(get("code_verifier").as_bytes())) != challenge {
            return refuse("invalid_grant");
        }
        let now = st.clock.as_ref().unwrap().now().timestamp();
        let (email, groups) = st.user.clone();
        let mut claims = json!({"iss": st.url, "sub": format!("sub-{email}"), "aud": CLIENT_ID,
            "exp": now + 300, "iat": now, "nonce": nonce, "email": email, "email_verified": st.email_verified,
            "groups": groups});
        let (mut alg, mut key) = (Algorithm::ES256, st.signing);
        match st.tamper {
            Tamper::None => {}
            Tamper::Nonce => claims["nonce"] = json!("another"),
            Tamper::Audience => claims["aud"] = json!("someone-else"),
            Tamper::IssuerSlash => claims["iss"] = json!(format!("{}/", st.url)),
            Tamper::Expired => claims["exp"] = json!(now - 3600),
            Tamper::ForeignKey => key = 2,
            Tamper::Hmac => alg = Algorithm::HS256,
        }
        let id_token = if alg == Algorithm::HS256 {
            let mut h = Header::new(alg);
            h.kid = Some(st.keys[0].kid.clone());
            jsonwebtoken::encode(&h, &claims, &EncodingKey::from_secret(CLIENT_SECRET.as_bytes())).unwrap()
        } else {
            let mut h = Header::new(alg);
            h.kid = Some(st.keys[key].kid.clone());
            jsonwebtoken::encode(&h, &claims, &st.keys[key].encoding).unwrap()
        };
        axum::Json(json!({"access_token": "at", "token_type": "Bearer", "id_token": id_token}))
            .into_response()
    }
}

async fn start(db: &TestDb, provider: &Provider, sso_only: bool) -> TestApp {
    let issuer = provider.url();
    let setup = Setup {
        settings: Box::new(move |s| {
            s.oidc_issuer = Some(issuer);
            s.oidc_client_id = Some(CLIENT_ID.into());
            s.oidc_client_secret = Some(aigw::config::Secret::new(CLIENT_SECRET));
            s.oidc_redirect_url = Some(format!("{PUBLIC}/admin/v1/auth/oidc/callback"));
            s.oidc_groups = vec![
                group("aigw-admins", "acme", "admin", None),
                group("eng", "acme", "member", Some("search")),
                group("nowhere", "ghost", "owner", None),
            ];
            if sso_only {
                s.sso_only_workspaces = vec!["acme".into()];
            }
        }),
        ..Setup::resources(
            fixture(&aigw::mock_upstream::MockUpstream::start().await.unwrap()).department("acme", "search"),
        )
    };
    let app = spawn_app(db, setup).await;
    provider.with(|st| st.clock = Some(app.clock.clone()));
    app
}

fn group(group: &str, workspace: &str, role: &str, department: Option<&str>) -> SsoGroup {
    SsoGroup {
        group: group.into(),
        workspace: workspace.into(),
        role: role.into(),
        department: department.map(str::to_owned),
    }
}

/// A browser without redirects followed by itself.
fn browser() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

fn location(r: &reqwest::Response) -> String {
    r.headers()[header::LOCATION].to_str().unwrap().to_owned()
}

/// Signs in as the provider's current user, like a browser: the token, or the error the console
/// is sent. `mangle` may change the callback URL (a forged state).
async fn sso(app: &TestApp, mangle: impl Fn(String) -> String, with_cookie: bool) -> Result<String, String> {
    let b = browser();
    let r = b
        .get(format!("{}/admin/v1/auth/oidc/start", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 302);
    let cookie = r.headers()[header::SET_COOKIE].to_str().unwrap().to_owned();
    for attr in [
        "HttpOnly",
        "SameSite=Lax",
        "Path=/admin/v1/auth/oidc",
        "Max-Age=600",
    ] {
        assert!(cookie.contains(attr), "{cookie}");
    }
    let cookie = cookie.split(';').next().unwrap().to_owned();
    let at_provider = b.get(location(&r)).send().await.unwrap();
    assert_eq!(at_provider.status(), 302, "{}", at_provider.text().await.unwrap());
    let back = mangle(location(&at_provider)).replace(PUBLIC, &app.address);
    let mut req = b.get(back);
    if with_cookie {
        req = req.header(header::COOKIE, cookie);
    }
    let r = req.send().await.unwrap();
    assert_eq!(r.status(), 303);
    let to = location(&r);
    let fragment = to
        .strip_prefix(&format!("{PUBLIC}/console/#"))
        .unwrap_or_else(|| panic!("not back to the console: {to}"));
    if let Some(token) = fragment.strip_prefix("sso_token=") {
        Ok(token.to_owned())
    } else {
        Err(fragment.strip_prefix("sso_error=").unwrap().to_owned())
    }
}

async fn me(app: &TestApp, token: &str) -> (u16, Value) {
    let r = app.get_as("/admin/v1/me", token).await;
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

async fn audit_actions(app: &TestApp) -> Vec<String> {
    let token = app.login(OWNER, OWNER_PASSWORD).await;
    let r: Value = app.get_as("/admin/v1/audit", &token).await.json().await.unwrap();
    let rows = r
        .get("data")
        .unwrap_or(&r)
        .as_array()
        .cloned()
        .unwrap_or_default();
    rows.iter()
        .filter_map(|e| e["action"].as_str().map(str::to_owned))
        .collect()
}

async fn sso_sign_in_follows_the_groups(db: TestDb) {
    let provider = Provider::start().await;
    let app = start(&db, &provider, false).await;
    let methods: Value = app.get("/admin/v1/auth/methods").await.json().await.unwrap();
    assert_eq!(methods["sso"]["start_url"], "/admin/v1/auth/oidc/start");

    // No mapped group, no member: refused, nobody created.
    provider.with(|st| st.user = ("carol@acme.test".into(), vec!["other".into()]));
    assert_eq!(sso(&app, |u| u, true).await, Err("no_access".into()));

    // First sign-in: created just in time, as the group says.
    provider.with(|st| st.user.1 = vec!["eng".into()]);
    let token = sso(&app, |u| u, true).await.unwrap();
    let (status, body) = me(&app, &token).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["email"], "carol@acme.test");
    assert_eq!(body["role"], "member");
    assert!(
        body["department_id"].is_number(),
        "the group's department: {body}"
    );

    // A higher group: the role follows.
    provider.with(|st| st.user.1 = vec!["eng".into(), "aigw-admins".into()]);
    let admin_token = sso(&app, |u| u, true).await.unwrap();
    assert_eq!(me(&app, &admin_token).await.1["role"], "admin");

    // Removed from every mapped group: refused, and the open sessions end.
    provider.with(|st| st.user.1 = vec![]);
    assert_eq!(sso(&app, |u| u, true).await, Err("no_access".into()));
    assert_eq!(
        me(&app, &admin_token).await.0,
        401,
        "the earlier session is revoked"
    );

    let actions = audit_actions(&app).await;
    for a in [
        "member.sso_create",
        "member.sso_update",
        "auth.sso_login",
        "auth.sso_denied",
    ] {
        assert!(actions.iter().any(|x| x == a), "{a} not audited: {actions:?}");
    }
    app.stop().await;
}

async fn sso_refuses_forged_sign_ins_and_follows_key_rotation(db: TestDb) {
    let provider = Provider::start().await;
    let app = start(&db, &provider, false).await;
    provider.with(|st| st.user = ("dan@acme.test".into(), vec!["eng".into()]));
    sso(&app, |u| u, true).await.unwrap();

    // A callback whose state is not this browser's, or without the browser's cookie.
    let forged = |u: String| {
        let i = u.find("state=").unwrap();
        format!("{}state=forged", &u[..i])
    };
    assert_eq!(sso(&app, forged, true).await, Err("state_mismatch".into()));
    assert_eq!(sso(&app, |u| u, false).await, Err("sign_in_expired".into()));
    // A code replayed: the provider refuses it.
    let b = browser();
    let r = b
        .get(format!("{}/admin/v1/auth/oidc/start", app.address))
        .send()
        .await
        .unwrap();
    let cookie = r.headers()[header::SET_COOKIE]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let back = location(&b.get(location(&r)).send().await.unwrap()).replace(PUBLIC, &app.address);
    for expect in ["sso_token=", "sso_error=provider_error"] {
        let r = b.get(&back).header(header::COOKIE, &cookie).send().await.unwrap();
        assert!(location(&r).contains(expect), "{expect}: {}", location(&r));
    }

    // ID tokens that must not pass.
    for tamper in [
        Tamper::Nonce,
        Tamper::Audience,
        Tamper::IssuerSlash,
        Tamper::Expired,
        Tamper::ForeignKey,
        Tamper::Hmac,
    ] {
        provider.with(|st| st.tamper = tamper);
        assert_eq!(
            sso(&app, |u| u, true).await,
            Err("token_refused".into()),
            "{tamper:?}"
        );
        app.clock.advance(chrono::Duration::seconds(1));
    }
    provider.with(|st| st.tamper = Tamper::None);

    // The provider rotates its key: the new key is fetched when a token names it.
    provider.with(|st| {
        st.published = 2;
        st.signing = 1;
    });
    // A key set of 2 MiB is refused, not read whole: the sign-in fails as the provider's fault.
    provider.with(|st| st.jwks_padding = 2 << 20);
    app.clock.advance(chrono::Duration::seconds(31));
    assert_eq!(sso(&app, |u| u, true).await, Err("provider_error".into()));
    provider.with(|st| st.jwks_padding = 0);
    app.clock.advance(chrono::Duration::seconds(31));
    let fetches = provider.with(|st| st.jwks_fetches);
    let token = sso(&app, |u| u, true).await.expect("signed with the new key");
    assert_eq!(me(&app, &token).await.0, 200);
    assert_eq!(provider.with(|st| st.jwks_fetches), fetches + 1);
    app.stop().await;
}

async fn sso_only_workspaces_refuse_passwords(db: TestDb) {
    let provider = Provider::start().await;
    let app = start(&db, &provider, true).await;
    let r = app.sign_in(OWNER, OWNER_PASSWORD).await;
    assert_eq!(r.status(), 403);
    let body: Value = r.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("single sign-on"),
        "{body}"
    );
    // A wrong password still says only that.
    let r = app.sign_in(OWNER, "wrong").await;
    assert_eq!(r.status(), 401);
    provider.with(|st| st.user = (OWNER.into(), vec!["aigw-admins".into()]));
    let token = sso(&app, |u| u, true).await.unwrap();
    let (status, body) = me(&app, &token).await;
    assert_eq!(status, 200);
    assert_eq!(body["role"], "owner", "single sign-on never demotes an owner");
    app.stop().await;
}

both_backends!(
    sso_sign_in_follows_the_groups,
    sso_refuses_forged_sign_ins_and_follows_key_rotation,
    sso_only_workspaces_refuse_passwords,
    identities_match_emails_whatever_their_case,
    sso_refuses_an_unverified_email_and_a_foreign_issuer,
);

/// The id of the member whose email is `email` exactly, as the owner lists them.
async fn member_ids(app: &TestApp, email: &str) -> Vec<i64> {
    let token = app.login(OWNER, OWNER_PASSWORD).await;
    let r: Value = app
        .get_as("/admin/v1/members", &token)
        .await
        .json()
        .await
        .unwrap();
    r["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["email"].as_str().is_some_and(|e| e.eq_ignore_ascii_case(email)))
        .map(|m| m["id"].as_i64().unwrap())
        .collect()
}

async fn login_status(app: &TestApp, email: &str, password: &str) -> u16 {
    app.sign_in(email, password).await.status().as_u16()
}

/// An email names one identity whatever its case, at the provider's sign-in and the password's:
/// a deactivated member stays out under another case, an existing member stored with capitals
/// is found, and no second member is created.
async fn identities_match_emails_whatever_their_case(db: TestDb) {
    let provider = Provider::start().await;
    let app = start(&db, &provider, false).await;
    let owner = app.login(OWNER, OWNER_PASSWORD).await;
    let [ada] = member_ids(&app, "ada@acme.test").await[..] else {
        panic!("ada");
    };
    let r = app
        .client
        .patch(format!("{}/admin/v1/members/{ada}", app.address))
        .bearer_auth(&owner)
        .json(&json!({"active": false}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    provider.with(|st| st.user = ("Ada@Acme.Test".into(), vec!["eng".into()]));
    assert_eq!(sso(&app, |u| u, true).await, Err("member_disabled".into()));
    assert_eq!(member_ids(&app, "ada@acme.test").await, [ada], "no second ada");

    // A member first seen through the provider signs in again with another case: the same one.
    provider.with(|st| st.user = ("carol@acme.test".into(), vec!["eng".into()]));
    let first = me(&app, &sso(&app, |u| u, true).await.unwrap()).await.1["id"].clone();
    provider.with(|st| st.user = ("CAROL@ACME.TEST".into(), vec!["eng".into()]));
    let again = me(&app, &sso(&app, |u| u, true).await.unwrap()).await.1["id"].clone();
    assert_eq!(first, again);
    assert_eq!(member_ids(&app, "carol@acme.test").await.len(), 1);

    // Passwords: the owner signs in under any case; a member stored with capitals too.
    assert_eq!(
        login_status(&app, &OWNER.to_uppercase(), OWNER_PASSWORD).await,
        200
    );
    let invite = json!({"email": "Mixed.Case@Acme.Test", "role": "admin"});
    let r = app
        .client
        .post(format!("{}/admin/v1/members", app.address))
        .bearer_auth(&owner)
        .json(&invite)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let invited: Value = r.json().await.unwrap();
    let password = invited["one_time_password"].as_str().unwrap();
    assert_eq!(login_status(&app, "mixed.case@acme.test", password).await, 200);
    let r = app
        .client
        .post(format!("{}/admin/v1/members", app.address))
        .bearer_auth(&owner)
        .json(&json!({"email": "MIXED.CASE@acme.test", "role": "member"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409, "the same email under another case exists");
    provider.with(|st| st.user = ("mixed.case@ACME.test".into(), vec!["aigw-admins".into()]));
    let token = sso(&app, |u| u, true).await.unwrap();
    assert_eq!(me(&app, &token).await.1["email"], "Mixed.Case@Acme.Test");
    assert_eq!(member_ids(&app, "mixed.case@acme.test").await.len(), 1);
    app.stop().await;

    // The resources file names carol, first seen through the provider, with capitals, and a
    // key of hers: the same member, who now holds the key.
    let mock = aigw::mock_upstream::MockUpstream::start().await.unwrap();
    let file = fixture(&mock)
        .department("acme", "search")
        .member("acme", "Carol@ACME.test", "member")
        .table("api_key", &[("member", "CAROL@acme.TEST"), ("name", "file")]);
    let app = spawn_app(&db, Setup::resources(file)).await;
    let [carol] = member_ids(&app, "carol@acme.test").await[..] else {
        panic!("one carol");
    };
    let owner = app.login(OWNER, OWNER_PASSWORD).await;
    let keys: Value = app.get_as("/admin/v1/keys", &owner).await.json().await.unwrap();
    let file_key = keys["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == "file")
        .cloned();
    assert_eq!(file_key.map(|k| k["member_id"].clone()), Some(json!(carol)));
    app.stop().await;
}

/// `email_verified` must be true when the provider sends it (as a boolean, or the string some
/// providers send), and the discovery document must name exactly the issuer configured (OpenID
/// Connect Discovery §4.3), a trailing `/` included.
async fn sso_refuses_an_unverified_email_and_a_foreign_issuer(db: TestDb) {
    let provider = Provider::start().await;
    let app = start(&db, &provider, false).await;
    provider.with(|st| st.user = ("dan@acme.test".into(), vec!["eng".into()]));
    for unverified in [json!(false), json!("false"), json!("no"), json!(0), json!(null)] {
        provider.with(|st| st.email_verified = unverified.clone());
        assert_eq!(
            sso(&app, |u| u, true).await,
            Err("token_refused".into()),
            "email_verified {unverified}"
        );
    }
    assert!(member_ids(&app, "dan@acme.test").await.is_empty());
    provider.with(|st| st.email_verified = json!("true"));
    sso(&app, |u| u, true).await.expect("the string \"true\"");
    provider.with(|st| st.email_verified = json!(true));
    sso(&app, |u| u, true).await.expect("verified");

    // A provider whose discovery document names another issuer: nothing signs in through it.
    let app = {
        app.stop().await;
        start(&db, &provider, false).await
    };
    let url = provider.url();
    for other in [
        "https://login.evil.test",
        &format!("{url}/realms/other"),
        &format!("{url}/"),
    ] {
        provider.with(|st| st.discovery_issuer = Some(other.to_owned()));
        let r = browser()
            .get(format!("{}/admin/v1/auth/oidc/start", app.address))
            .send()
            .await
            .unwrap();
        assert_ne!(r.status(), 302, "{other}: no redirect to the provider");
    }
    app.stop().await;
}
