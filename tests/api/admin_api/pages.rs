//! Lists that grow with the tenancy (keys, members, policies, upstreams) come a page at a time:
//! `limit` rows in id order, `next_cursor` to the next page, every row exactly once.

use super::*;

both_backends!(growing_lists_come_in_pages_that_cover_every_row_once,);

async fn growing_lists_come_in_pages_that_cover_every_row_once(db: TestDb) {
    let mock = MockUpstream::start().await.unwrap();
    let app = spawn_app(&db, Setup::resources(resources(&mock))).await;
    let admin = Admin { app: &app };
    let owner = admin.login("owner@acme.test").await;
    // Enough of each for several pages of 2.
    for i in 0..5 {
        admin
            .ok(
                Method::POST,
                "/admin/v1/keys",
                &owner,
                Some(json!({"name": format!("page-{i}")})),
            )
            .await;
        admin
            .ok(
                Method::POST,
                "/admin/v1/members",
                &owner,
                Some(json!({"email": format!("page{i}@acme.test"), "role": "member"})),
            )
            .await;
        admin
            .ok(
                Method::POST,
                "/admin/v1/policies",
                &owner,
                Some(json!({"subject": "ws", "metric": "requests", "window": format!("{}minutes", i + 2), "limit": 100})),
            )
            .await;
        admin
            .ok(
                Method::POST,
                "/admin/v1/upstreams",
                &owner,
                Some(json!({"name": format!("page-{i}"), "provider": "openai", "api_key": "x", "models": ["m"]})),
            )
            .await;
    }
    for list in ["keys", "members", "policies", "upstreams"] {
        let whole = admin
            .ok(Method::GET, &format!("/admin/v1/{list}?limit=1000"), &owner, None)
            .await;
        assert_eq!(whole["next_cursor"], Value::Null, "{list}: one page holds all");
        let all: Vec<i64> = ids(&whole);
        assert!(all.len() >= 5, "{list}: {whole}");
        let (mut paged, mut cursor, mut pages) = (Vec::new(), None::<i64>, 0);
        loop {
            let path = match cursor {
                Some(c) => format!("/admin/v1/{list}?limit=2&cursor={c}"),
                None => format!("/admin/v1/{list}?limit=2"),
            };
            let page = admin.ok(Method::GET, &path, &owner, None).await;
            let got = ids(&page);
            assert!(got.len() <= 2, "{list}: {page}");
            paged.extend(got);
            pages += 1;
            match page["next_cursor"].as_i64() {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        assert_eq!(paged, all, "{list}: the pages cover every row once, in id order");
        assert_eq!(pages, all.len().div_ceil(2), "{list}");
    }
    for (bad, status_wanted) in [("limit=0", 422), ("limit=1001", 422), ("limit=ten", 400)] {
        let (status, body) = admin
            .call(Method::GET, &format!("/admin/v1/keys?{bad}"), Some(&owner), None)
            .await;
        assert_eq!(status, status_wanted, "{bad}: {body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains("limit"),
            "{bad}: {body}"
        );
    }
}

fn ids(page: &Value) -> Vec<i64> {
    page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect()
}
