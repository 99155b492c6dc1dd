//! The admin API (issue 7), a file per topic: every route × every role from the access table
//! (`access`), ownership and workspace isolation (`isolation`), guardrail changes enforced at
//! once and audited (`guardrails`), sign-in, tokens and members (`accounts`), field errors and
//! secrets that never come back (`inputs`), logs, usage and quota reports (`reports`).

use aigw::mock_upstream::{MockUpstream, Script};
use reqwest::Method;
use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{ResourcesBuilder, Setup, TestApp, TestDb, price, spawn_app};
use crate::proxy::KEY;

mod access;
mod accounts;
mod audit_names;
mod credential_figures;
mod guardrails;
mod inputs;
mod isolation;
mod log_search;
mod member_usage;
mod months;
mod pages;
mod reports;
mod rollup_interval;
mod tokens;
mod window_end;

const OTHER_KEY: &str = "sk-aigw-OTHERotherOTHERotherOTHERoth1234";
const UPSTREAM_SECRET: &str = "sk-upstream-secret-4f9a0c2e7d";

/// acme with one member of each role (ada is a plain member with a key), and a second workspace
/// whose ids must never be reachable from acme.
fn resources(mock: &MockUpstream) -> String {
    let url = &mock.base_url();
    let member = |file: ResourcesBuilder, email: &str, ws: &str, role: &str| {
        file.member_with_password(ws, email, role, &format!("pw-{email}"))
    };
    let mut file = ResourcesBuilder::new()
        .workspace("acme")
        .workspace("other")
        .department("acme", "research");
    file = member(file, "owner@acme.test", "acme", "owner");
    file = member(file, "admin@acme.test", "acme", "admin");
    file = member(file, "ada@acme.test", "acme", "member");
    file = member(file, "bob@acme.test", "acme", "member");
    file = member(file, "boss@other.test", "other", "owner");
    file.api_key("ada@acme.test", "ci", KEY)
        .api_key("boss@other.test", "ops", OTHER_KEY)
        .upstream("acme", "primary", url, "cred-primary", &["gpt-4o-mini"])
        .upstream("other", "theirs", url, "cred-theirs", &["gpt-4o-mini"])
        .model("acme", "gpt-4o-mini")
        .with("price", price(1.0, 2.0))
        .model("other", "gpt-4o-mini")
        .into()
}

/// An admin API client for one test gateway.
struct Admin<'a> {
    app: &'a TestApp,
}

impl Admin<'_> {
    async fn login(&self, email: &str) -> String {
        let r = self
            .call(
                Method::POST,
                "/admin/v1/auth/login",
                None,
                Some(json!({"email": email, "password": format!("pw-{email}")})),
            )
            .await;
        assert_eq!(r.0, 200, "sign-in of {email}: {}", r.1);
        r.1["token"].as_str().unwrap().to_owned()
    }

    /// Status and JSON body (`null` when the body is not JSON).
    async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .app
            .client
            .request(method, format!("{}{path}", self.app.address));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    async fn ok(&self, method: Method, path: &str, token: &str, body: Option<Value>) -> Value {
        let (status, v) = self.call(method.clone(), path, Some(token), body).await;
        assert!((200..300).contains(&status), "{method} {path}: {status} {v}");
        v
    }
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::now_v7().simple())
}
