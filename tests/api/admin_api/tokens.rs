//! Admin service tokens (DESIGN.md §11, issue 46): a script administers the gateway with one
//! (created by an owner, sent as `Authorization: Bearer`, revoked and refused at once on every
//! gateway), and the attacks on them are refused: no token above its creator's role, none above
//! the token that creates it, demotion and deactivation of the creator, expiry, revocation by a
//! lower role, sign-out and password change, another workspace's ids.

use super::*;

both_backends!(
    a_script_administers_with_a_service_token,
    service_tokens_cannot_climb,
);

/// Creates a token as `who` (a session or a service token); status and body.
async fn mint(admin: &Admin<'_>, who: &str, role: &str, expires_at: Option<&str>) -> (u16, Value) {
    let mut body = json!({"name": unique("script"), "role": role});
    if let Some(e) = expires_at {
        body["expires_at"] = json!(e);
    }
    admin
        .call(Method::POST, "/admin/v1/tokens", Some(who), Some(body))
        .await
}

/// The secret of a token `who` creates with `role`.
async fn secret(admin: &Admin<'_>, who: &str, role: &str) -> (i64, String) {
    let (status, v) = mint(admin, who, role, None).await;
    assert_eq!(status, 201, "{v}");
    (v["id"].as_i64().unwrap(), v["token"].as_str().unwrap().to_owned())
}

fn id_of_email(members: &Value, email: &str) -> i64 {
    members["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["email"] == email)
        .unwrap()["id"]
        .as_i64()
        .unwrap()
}

async fn a_script_administers_with_a_service_token(db: TestDb) {
    crate::helpers::logged_warnings();
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let replica = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let admin = Admin { app: &app };
    let on_replica = Admin { app: &replica };
    let owner = admin.login("owner@acme.test").await;

    // Created by the owner: the secret once, in its own shape, with a display prefix.
    let (status, created) = mint(&admin, &owner, "admin", None).await;
    assert_eq!(status, 201, "{created}");
    let token = created["token"].as_str().unwrap().to_owned();
    assert!(
        token.starts_with("aigw_st_")
            && token.len() == 51
            && token[8..].bytes().all(|b| b.is_ascii_alphanumeric()),
        "{token}"
    );
    assert_eq!(created["prefix"], token[..12]);
    assert_eq!(
        (&created["role"], &created["status"], &created["created_by_email"]),
        (&json!("admin"), &json!("active"), &json!("owner@acme.test"))
    );
    assert_eq!(created["last_used_at"], Value::Null);

    // A script uses it as a bearer: who it is, and a few changes an admin may make.
    let me = admin.ok(Method::GET, "/admin/v1/me", &token, None).await;
    assert_eq!(
        (&me["email"], &me["role"], &me["service_token"]["name"]),
        (&json!("owner@acme.test"), &json!("admin"), &created["name"])
    );
    let dept = admin
        .ok(
            Method::POST,
            "/admin/v1/departments",
            &token,
            Some(json!({"name": "platform"})),
        )
        .await;
    let members = admin.ok(Method::GET, "/admin/v1/members", &token, None).await;
    let ada = id_of_email(&members, "ada@acme.test");
    let key = admin
        .ok(
            Method::POST,
            "/admin/v1/keys",
            &token,
            Some(json!({"name": "deploy", "member_id": ada})),
        )
        .await;
    admin
        .ok(
            Method::PATCH,
            &format!("/admin/v1/members/{ada}"),
            &token,
            Some(json!({"department_id": dept["id"]})),
        )
        .await;
    // The replica takes it as well, with nothing to sync.
    on_replica.ok(Method::GET, "/admin/v1/keys", &token, None).await;

    // The audit log names the token with each change it made, never its secret.
    let audit = admin.ok(Method::GET, "/admin/v1/audit", &owner, None).await;
    let by_token: Vec<&Value> = audit["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e["actor_token"]
                .as_str()
                .is_some_and(|t| t.contains(created["name"].as_str().unwrap()))
        })
        .collect();
    let kinds: Vec<&str> = by_token
        .iter()
        .map(|e| e["target_kind"].as_str().unwrap())
        .collect();
    for kind in ["department", "api_key", "member"] {
        assert!(
            kinds.contains(&kind),
            "{kind} not audited with the token: {kinds:?}"
        );
    }
    assert!(by_token.iter().all(|e| e["actor_email"] == "owner@acme.test"));
    let created_entry = audit["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["target_kind"] == "service_token" && e["action"] == "create")
        .expect("the creation is audited");
    assert_eq!(created_entry["target_id"], created["id"]);

    // Listed (revoked and active alike) with its last use, never with its secret.
    let list = admin.ok(Method::GET, "/admin/v1/tokens", &owner, None).await;
    let listed = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == created["id"])
        .unwrap();
    assert_eq!(listed["last_used_at"], json!(app.clock.now_ms()));
    for text in [list.to_string(), audit.to_string(), key.to_string()] {
        assert!(!text.contains(&token[8..]), "the secret came back: {text}");
    }

    // Revoked by the owner: refused at once, here and on the replica.
    let (status, _) = admin
        .call(
            Method::DELETE,
            &format!("/admin/v1/tokens/{}", created["id"]),
            Some(&owner),
            None,
        )
        .await;
    assert_eq!(status, 204);
    for (gateway, who) in [(&admin, "this gateway"), (&on_replica, "the replica")] {
        let (status, v) = gateway
            .call(Method::GET, "/admin/v1/keys", Some(&token), None)
            .await;
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (401, Some("invalid_token")),
            "{who}: {v}"
        );
    }
    let list = admin.ok(Method::GET, "/admin/v1/tokens", &owner, None).await;
    let listed = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == created["id"])
        .unwrap();
    assert_eq!(
        (&listed["status"], &listed["revoked_by_email"]),
        (&json!("revoked"), &json!("owner@acme.test"))
    );
    let audit = admin.ok(Method::GET, "/admin/v1/audit", &owner, None).await;
    assert!(
        audit["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["target_kind"] == "service_token"
                && e["action"] == "revoke"
                && e["target_id"] == created["id"]),
        "the revocation is audited"
    );
    // Never in the gateway's own log lines either.
    assert!(
        crate::helpers::logged_warnings()
            .iter()
            .all(|l| !l.contains(&token[8..])),
        "the secret was logged"
    );
    replica.stop().await;
    app.stop().await;
}

async fn service_tokens_cannot_climb(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let admin = Admin { app: &app };
    let owner = admin.login("owner@acme.test").await;
    let admin_session = admin.login("admin@acme.test").await;
    let forbidden = |(status, v): (u16, Value), what: &str| {
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (403, Some("forbidden")),
            "{what}: {v}"
        );
        v["error"]["message"].as_str().unwrap_or_default().to_owned()
    };
    let refused = |(status, v): (u16, Value), what: &str| {
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (401, Some("invalid_token")),
            "{what}: {v}"
        );
    };

    // An admin mints no owner token, in person or through an admin token; a member no token.
    let message = forbidden(
        mint(&admin, &admin_session, "owner", None).await,
        "an admin's owner token",
    );
    assert!(message.contains("you act as admin"), "{message}");
    let (_, admins) = secret(&admin, &admin_session, "admin").await;
    forbidden(
        mint(&admin, &admins, "owner", None).await,
        "an owner token from an admin token",
    );
    let (_, members_token) = secret(&admin, &admins, "member").await;
    forbidden(
        mint(&admin, &members_token, "member", None).await,
        "a token from a member token",
    );
    let ada = admin.login("ada@acme.test").await;
    forbidden(mint(&admin, &ada, "member", None).await, "a member's token");
    let (status, v) = mint(&admin, &owner, "superuser", None).await;
    assert_eq!((status, v["error"]["param"].as_str()), (422, Some("role")), "{v}");

    // A token does what its role allows, and no more.
    let (owners_id, owners) = secret(&admin, &owner, "owner").await;
    admin
        .ok(
            Method::PATCH,
            "/admin/v1/workspace",
            &owners,
            Some(json!({"timezone": "Asia/Shanghai"})),
        )
        .await;
    let message = forbidden(
        admin
            .call(
                Method::PATCH,
                "/admin/v1/workspace",
                Some(&admins),
                Some(json!({"timezone": "UTC"})),
            )
            .await,
        "an admin token on an owner route",
    );
    assert!(message.contains("this service token acts as admin"), "{message}");
    forbidden(
        admin
            .call(Method::GET, "/admin/v1/members", Some(&members_token), None)
            .await,
        "a member token on an admin route",
    );
    let members = admin.ok(Method::GET, "/admin/v1/members", &owner, None).await;
    let ada_id = id_of_email(&members, "ada@acme.test");
    forbidden(
        admin
            .call(
                Method::POST,
                "/admin/v1/keys",
                Some(&members_token),
                Some(json!({"name": "x", "member_id": ada_id})),
            )
            .await,
        "a member token's key for someone else",
    );

    // An admin cannot stop the owner's automation; the owner can.
    forbidden(
        admin
            .call(
                Method::DELETE,
                &format!("/admin/v1/tokens/{owners_id}"),
                Some(&admin_session),
                None,
            )
            .await,
        "an admin revoking an owner token",
    );
    admin.ok(Method::GET, "/admin/v1/me", &owners, None).await;

    // Sign-out and password change are a person's.
    forbidden(
        admin
            .call(Method::POST, "/admin/v1/auth/logout", Some(&owners), None)
            .await,
        "a token signing out",
    );
    admin.ok(Method::GET, "/admin/v1/me", &owner, None).await;
    forbidden(
        admin
            .call(
                Method::POST,
                "/admin/v1/auth/password",
                Some(&owners),
                Some(json!({"current_password": "pw-owner@acme.test", "new_password": "something-new-1"})),
            )
            .await,
        "a token changing a password",
    );

    // Demoting the creator demotes their tokens; deactivating them stops them.
    let admin_id = id_of_email(&members, "admin@acme.test");
    admin
        .ok(
            Method::PATCH,
            &format!("/admin/v1/members/{admin_id}"),
            &owner,
            Some(json!({"role": "member"})),
        )
        .await;
    let me = admin.ok(Method::GET, "/admin/v1/me", &admins, None).await;
    assert_eq!(me["role"], "member");
    forbidden(
        admin
            .call(Method::GET, "/admin/v1/members", Some(&admins), None)
            .await,
        "the token of a demoted admin",
    );
    admin
        .ok(
            Method::PATCH,
            &format!("/admin/v1/members/{admin_id}"),
            &owner,
            Some(json!({"active": false})),
        )
        .await;
    refused(
        admin.call(Method::GET, "/admin/v1/me", Some(&admins), None).await,
        "the token of a deactivated member",
    );

    // Expiry is optional; once it passes, the token is refused.
    let soon = (app.clock.now() + chrono::Duration::hours(1)).to_rfc3339();
    let (status, expiring) = mint(&admin, &owner, "member", Some(&soon)).await;
    assert_eq!(status, 201, "{expiring}");
    let expiring = expiring["token"].as_str().unwrap().to_owned();
    let past = (app.clock.now() - chrono::Duration::hours(1)).to_rfc3339();
    let (status, v) = mint(&admin, &owner, "member", Some(&past)).await;
    assert_eq!(
        (status, v["error"]["param"].as_str()),
        (422, Some("expires_at")),
        "{v}"
    );
    admin.ok(Method::GET, "/admin/v1/me", &expiring, None).await;
    app.clock.advance(chrono::Duration::minutes(61));
    refused(
        admin
            .call(Method::GET, "/admin/v1/me", Some(&expiring), None)
            .await,
        "an expired token",
    );

    // Forged, truncated and foreign tokens; another workspace's token sees none of acme's.
    let forged = format!("aigw_st_{}", "A".repeat(43));
    for bad in [
        forged.as_str(),
        &owners[..40],
        "aigw_st_",
        "eyJhbGciOiJub25lIn0.e30.",
    ] {
        refused(
            admin.call(Method::GET, "/admin/v1/me", Some(bad), None).await,
            bad,
        );
    }
    let boss = admin.login("boss@other.test").await;
    let (_, theirs) = secret(&admin, &boss, "owner").await;
    let (status, _) = admin
        .call(
            Method::DELETE,
            &format!("/admin/v1/tokens/{owners_id}"),
            Some(&theirs),
            None,
        )
        .await;
    assert_eq!(status, 404, "another workspace's token is not found");
    let theirs_list = admin.ok(Method::GET, "/admin/v1/tokens", &theirs, None).await;
    assert!(
        theirs_list["data"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["created_by_email"] == "boss@other.test")
    );
    admin.ok(Method::GET, "/admin/v1/me", &owners, None).await;
    app.stop().await;
}
